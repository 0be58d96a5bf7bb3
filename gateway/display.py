"""Text for people: control and bidi characters made visible, nothing dropped.

Every output a person reads (the audit table, policy and config messages, CLI
errors, log lines) passes what peers and files wrote through ``printable``
first. Without it a newline in a capability name prints a second, forged audit
row, ESC and CR sequences rewrite the operator's terminal, and bidi overrides
make text read differently from what it holds.

Escaped (``UNSAFE_CHARACTERS``): C0 controls, DEL and C1 controls as ``\\xNN``;
the line and paragraph separators U+2028/U+2029, the bidi marks, embeddings,
overrides and isolates (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069)
and lone surrogates as ``\\uNNNN``. Text without any of them is returned
unchanged; text with some also has each backslash doubled, so the original can
always be read back. Machine outputs (``audit --json``) stay exact instead:
``json_for_terminals`` writes the same characters as JSON escapes.
"""

from __future__ import annotations

import logging
import re
from types import TracebackType

_UNSAFE_CLASS = (
    "\x00-\x1f\x7f-\x9f"  # C0, DEL, C1 (NEL U+0085 and CSI U+009B among them)
    "\u061c\u200e\u200f"  # Arabic letter mark, LRM, RLM
    "\u2028\u2029"  # line and paragraph separators
    "\u202a-\u202e"  # bidi embeddings and overrides
    "\u2066-\u2069"  # bidi isolates
    "\ud800-\udfff"  # lone surrogates (cannot even be encoded for a terminal)
)
UNSAFE_CHARACTERS = re.compile(f"[{_UNSAFE_CLASS}]")
"""Characters that can break a line, move the cursor or reorder text on display."""

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
_ESCAPED = re.compile(f"[{_UNSAFE_CLASS}\\\\]")


def has_unsafe_characters(text: str) -> bool:
    """True if ``text`` holds any character of ``UNSAFE_CHARACTERS``."""
    return UNSAFE_CHARACTERS.search(text) is not None


def printable(text: str) -> str:
    """``text`` safe to show a person: one line, no terminal control, no reordering.

    Returns ``text`` itself when it holds nothing unsafe. Otherwise every
    unsafe character becomes ``\\xNN`` (below U+0100) or ``\\uNNNN`` and every
    backslash ``\\\\``, so the escaping is reversible.
    """
    if UNSAFE_CHARACTERS.search(text) is None:
        return text
    return _ESCAPED.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class EscapingFormatter(logging.Formatter):
    """A log formatter that passes each record's message (with its args) through ``printable``.

    Log messages carry ids and names that peers chose. Tracebacks keep their
    line structure, but each of their lines is escaped too.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """Format with the record's message escaped."""
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:
        """The traceback, each line escaped."""
        text = super().formatException(ei)
        return "\n".join(printable(line) for line in text.split("\n"))

    def formatStack(self, stack_info: str) -> str:
        """The stack, each line escaped."""
        return "\n".join(printable(line) for line in stack_info.split("\n"))


def json_for_terminals(json_text: str) -> str:
    """JSON text with every unsafe character written as a ``\\uNNNN`` escape.

    ``json.dumps(..., ensure_ascii=False)`` escapes only C0; DEL, C1, the
    separators and bidi controls (and lone surrogates, which no terminal
    encoding accepts) stay raw. Escaped, the text still parses to exactly the
    same values, and is safe to print. Only valid inside JSON strings, where
    every such character of ``json.dumps`` output is.
    """
    return UNSAFE_CHARACTERS.sub(lambda match: f"\\u{ord(match.group()):04x}", json_text)
