"""Sentences of the docs' prose, and how many run long.

A page's prose is what a reader reads as sentences: fenced blocks, tables,
headings and HTML comments are left out; list items and paragraphs are read
on their own. A sentence ends at ``.``, ``!`` or ``?`` followed by a space and
a capital letter, a backtick, a bracket or a quote (``e.g.``, ``i.e.`` and
``etc.`` end none). Words are what whitespace separates (inline code counts).

Run ``python -m tests.docs.prose [PAGE...]`` for the share of sentences over
:data:`LONG_WORDS` words, per page and in all (default pages: the README,
CONTRIBUTING and ``docs/*.md``); ``--list`` prints the long ones.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG_WORDS = 40
"""A sentence of more words than this counts as long."""

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf)\.", re.I)
_END = re.compile(r"(?<=[.!?])[)\"']?\s+(?=[A-Z`\[(\"*_0-9])")


@dataclass(frozen=True)
class Sentence:
    """One sentence of prose: its page, the line its chunk starts on, its text."""

    page: Path
    line: int
    text: str

    @property
    def words(self) -> int:
        """Whitespace-separated words."""
        return len(self.text.split())


def default_pages() -> list[Path]:
    """The README, CONTRIBUTING and every page under ``docs/``."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _chunks(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each paragraph or list item of prose."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731 - keep line numbers
    text = _COMMENT.sub(blank, _FENCE.sub(blank, text))
    current: list[str] = []
    start = 0
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.strip()
        skip = not stripped or stripped.startswith(("|", "#", "<", ">"))
        if skip or _ITEM.match(line):
            if current:
                yield start, " ".join(current)
            current = []
            if skip:
                continue
        if not current:
            start = number
        current.append(_ITEM.sub("", line).strip())
    if current:
        yield start, " ".join(current)


def sentences(page: Path) -> list[Sentence]:
    """Every sentence of ``page``'s prose, in order."""
    found = []
    for line, chunk in _chunks(page.read_text(encoding="utf-8")):
        masked = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "\0"), chunk)
        for part in _END.split(masked):
            part = part.replace("\0", ".").strip()
            if part:
                found.append(Sentence(page, line, part))
    return found


def long_share(found: list[Sentence]) -> float:
    """The share of ``found`` over :data:`LONG_WORDS` words (0 when empty)."""
    return sum(s.words > LONG_WORDS for s in found) / len(found) if found else 0.0


def main(argv: list[str]) -> None:
    """Print each page's sentences, long ones and share, and the total."""
    show = "--list" in argv
    pages = [Path(a) for a in argv if a != "--list"] or default_pages()
    everything: list[Sentence] = []
    for page in pages:
        found = sentences(page)
        everything += found
        long = [s for s in found if s.words > LONG_WORDS]
        name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        print(f"{name!s:28} {len(found):5} sentences {len(long):4} long {long_share(found):6.1%}")
        if show:
            for s in long:
                print(f"    {s.line}: ({s.words}) {s.text}")
    long_count = sum(s.words > LONG_WORDS for s in everything)
    print(
        f"{'all':28} {len(everything):5} sentences {long_count:4} long {long_share(everything):6.1%}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
