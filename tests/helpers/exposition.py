"""A strict reader of the Prometheus text format (0.0.4), for tests of what we expose."""

from __future__ import annotations

import re

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_VALUE = r"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|Inf)|NaN)"
_SAMPLE = re.compile(rf"({_METRIC})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? {_VALUE}")
_COMMENT = re.compile(rf"# (?:HELP {_METRIC} .*|TYPE {_METRIC} (?:counter|gauge|histogram))")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def samples(text: str) -> list[tuple[str, dict[str, str]]]:
    """Every sample's metric name and labels; AssertionError on any line that is not valid."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    found: list[tuple[str, dict[str, str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if _COMMENT.fullmatch(line):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match is not None, f"line {number} is not valid exposition text: {line[:200]!r}"
        pairs = _PAIR.findall(match.group(2) or "")
        labels = dict(pairs)
        assert len(labels) == len(pairs), f"line {number}: a label name twice"
        found.append((match.group(1), labels))
    return found
