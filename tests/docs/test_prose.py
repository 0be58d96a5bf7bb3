"""The docs keep one claim per sentence: at most 5% of their sentences run over 40 words.

``tests/docs/prose.py`` splits the prose of README.md, CONTRIBUTING.md and ``docs/*.md`` into
sentences (code blocks, tables, headings and comments left out).
``python -m tests.docs.prose --list`` names the long ones, page and line.
"""

from __future__ import annotations

from pathlib import Path

from tests.docs.prose import LONG_WORDS, default_pages, long_share, sentences

MAX_LONG_SHARE = 0.05


def test_at_most_one_sentence_in_twenty_runs_long() -> None:
    found = [s for page in default_pages() if page.exists() for s in sentences(page)]
    long = [f"{s.page.name}:{s.line} ({s.words} words)" for s in found if s.words > LONG_WORDS]
    assert long_share(found) <= MAX_LONG_SHARE, long


def test_sentences_are_read_as_written(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A heading. Not prose\n\n"
        "One claim, e.g. this one. `code` starts the next; it stays one.\n"
        "A wrapped line\ncontinues it.\n\n"
        "| a table. Not prose |\n\n"
        "```sh\necho not prose. At all\n```\n"
        "- an item. Two\n- another\n"
    )
    assert [s.text for s in sentences(page)] == [
        "One claim, e.g. this one.",
        "`code` starts the next; it stays one.",
        "A wrapped line continues it.",
        "an item.",
        "Two",
        "another",
    ]
    assert [s.line for s in sentences(page)] == [3, 3, 3, 12, 12, 13]
