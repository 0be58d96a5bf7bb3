"""Every relative link of README.md, CONTRIBUTING.md and docs/*.md reaches a page and a heading.

Pages moved out of the README kept links written from the repository root
(``docs/x.md`` inside ``docs/``), which render as dead links; this suite fails on
such a link, naming the page and the target.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\((?P<target>[A-Za-z0-9_./-]*\.md)?(?:#(?P<anchor>[A-Za-z0-9_-]+))?\)")
_FENCED = re.compile(r"^```.*?^```", re.S | re.M)
_HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.M)


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors of the page's headings (lower case, punctuation dropped, - for space)."""
    prose = _FENCED.sub("", text)
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in _HEADING.findall(prose)
    }


def broken_links(page: Path) -> list[str]:
    """``target#anchor`` of each relative link on ``page`` that reaches no file or no heading."""
    broken = []
    for link in _LINK.finditer(_FENCED.sub("", page.read_text(encoding="utf-8"))):
        target, anchor = link.group("target"), link.group("anchor")
        path = (page.parent / target).resolve() if target else page
        if not path.is_file():
            broken.append(f"{target} (no such file)")
        elif anchor and anchor not in heading_anchors(path.read_text(encoding="utf-8")):
            broken.append(f"{target or ''}#{anchor} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_root_relative_link_inside_docs_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "a.md"
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Signed cards\n")
    page.write_text(
        "[ok](b.md#signed-cards), [self](#a), [moved](docs/b.md), [gone](b.md#nothing)\n\n# A\n"
    )
    assert broken_links(page) == ["docs/b.md (no such file)", "b.md#nothing (no such heading)"]
