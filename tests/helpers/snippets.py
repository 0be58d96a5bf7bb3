"""Fenced snippets of the Markdown docs, and how each one is meant to be used.

Docs are code: every ``sh``/``bash``/``python`` block in ``README.md``, ``CONTRIBUTING.md`` and
``docs/*.md`` runs in the test suite, in order, in one scratch folder per page, unless the line
right before its fence says otherwise. The markers (HTML comments, so readers never see them):

- ``<!-- snippet: not-runnable: WHY -->``: shown, never run (a synopsis, a remote host).
- ``<!-- snippet: file NAME -->``: the block's text is written to ``NAME`` in the page's folder
  (configs and plans the page's commands then use).
- ``<!-- snippet: hidden`` ... ``-->`` around a block: run, but not rendered (set-up a reader has
  already done on another page, such as minting certificates).

Blocks in other languages (``toml``, ``json``, ``text``, ``go``, ``js``) are data: they run only
through a ``file`` marker (the JavaScript and Go clients run in tests/interop instead).

A page whose snippets need a harness of their own (an agent served in the test, environment
variables naming its URL and certificates) says so once, anywhere on the page:
``<!-- snippets: run by tests/PATH.py -->``; this suite then checks that the file exists
instead of running the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

RUNNABLE_LANGUAGES = frozenset({"sh", "bash", "shell", "python"})
_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
_MARKER = re.compile(
    r"^<!-- snippet: (?P<kind>not-runnable|file|hidden)(?P<rest>.*?)\s*(?:-->)?\s*$"
)


class Use(StrEnum):
    """What the test suite does with one block."""

    RUN = "run"
    WRITE_FILE = "file"
    SHOW = "show"  # data (toml, json, ...) or marked not-runnable


@dataclass(frozen=True)
class Snippet:
    """One fenced block: where it is, its language, its text and its use."""

    page: Path
    line: int
    language: str
    text: str
    use: Use
    file_name: str = ""

    @property
    def where(self) -> str:
        """``page:line`` of the opening fence, for failure messages."""
        return f"{self.page}:{self.line}"


_RUN_BY = re.compile(r"^<!-- snippets: run by (?P<path>tests/[A-Za-z0-9_/]+\.py) -->$", re.M)


def external_runner(page: Path) -> str | None:
    """The test file that runs ``page``'s snippets itself, if the page names one."""
    found = _RUN_BY.search(page.read_text(encoding="utf-8"))
    return found.group("path") if found else None


class SnippetSyntaxError(ValueError):
    """A marker that does not say what to do, or a fence left open."""


def snippets(page: Path) -> list[Snippet]:
    """Every fenced block of ``page``, in order, with its use."""
    lines = page.read_text(encoding="utf-8").split("\n")
    found: list[Snippet] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = _closing_fence(lines, index, page)
        marker = _MARKER.match(lines[index - 1]) if index > 0 else None
        found.append(_snippet(page, index, fence.group(1), lines[index + 1 : end], marker))
        index = end + 1
    return found


def _closing_fence(lines: list[str], start: int, page: Path) -> int:
    for end in range(start + 1, len(lines)):
        if lines[end] == "```":
            return end
    raise SnippetSyntaxError(f"{page}:{start + 1}: fence never closed")


def _snippet(
    page: Path, index: int, language: str, body: list[str], marker: re.Match[str] | None
) -> Snippet:
    text = "\n".join(body) + "\n"
    where = dict(page=page, line=index + 1, language=language, text=text)
    if marker is None:
        use = Use.RUN if language in RUNNABLE_LANGUAGES else Use.SHOW
        return Snippet(**where, use=use)  # type: ignore[arg-type]
    kind, rest = marker.group("kind"), marker.group("rest").strip()
    if kind == "not-runnable":
        if not rest.startswith(":") or not rest[1:].strip():
            raise SnippetSyntaxError(f"{page}:{index}: not-runnable needs ': why'")
        return Snippet(**where, use=Use.SHOW)  # type: ignore[arg-type]
    if kind == "file":
        if not re.fullmatch(r"[A-Za-z0-9._/-]+", rest) or ".." in rest:
            raise SnippetSyntaxError(f"{page}:{index}: file marker needs a relative NAME")
        return Snippet(**where, use=Use.WRITE_FILE, file_name=rest)  # type: ignore[arg-type]
    if language not in RUNNABLE_LANGUAGES:
        raise SnippetSyntaxError(f"{page}:{index}: a hidden block must be sh or python")
    return Snippet(**where, use=Use.RUN)  # type: ignore[arg-type]
