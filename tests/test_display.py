"""Text shown to people: every control and bidi class escaped, nothing lost, one line per row."""

from __future__ import annotations

import hashlib
import json
import logging
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audit import AuditRecord, format_json_lines, format_table
from gateway.display import (
    EscapingFormatter,
    has_unsafe_characters,
    json_for_terminals,
    printable,
)

UNSAFE = (
    [chr(c) for c in range(0x20)]  # C0
    + ["\x7f"]  # DEL
    + [chr(c) for c in range(0x80, 0xA0)]  # C1
    + ["\u2028", "\u2029"]  # separators
    + ["\u061c", "\u200e", "\u200f"]  # marks
    + [chr(c) for c in range(0x202A, 0x202F)]  # embeddings, overrides
    + [chr(c) for c in range(0x2066, 0x206A)]  # isolates
)
"""Every character the issue names, one by one."""

hostile_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(UNSAFE),
        st.sampled_from(["\\", "x", "u", "0", "a", " ", "é", "\u05d0", "\U0001f600"]),
        st.characters(),
        st.characters(categories=["Cs"]),  # lone surrogates
    ),
    max_size=40,
)
"""Text mixing every unsafe class with ordinary (and escape-looking) characters."""

_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4})")


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        body = match.group(1)
        return "\\" if body == "\\" else chr(int(body[1:], 16))

    return _ESCAPE.sub(one, text)


def _assert_safe_single_line(text: str) -> None:
    assert not has_unsafe_characters(text), ascii(text)
    assert len(text.splitlines()) <= 1, ascii(text)


def test_every_named_character_is_escaped_visibly() -> None:
    for char in UNSAFE:
        shown = printable(f"a{char}b")
        code = ord(char)
        assert shown == (f"a\\x{code:02x}b" if code < 0x100 else f"a\\u{code:04x}b")


def test_plain_text_is_returned_unchanged() -> None:
    for text in ("text.echo", "spiffe://example.org/agent/bob", "C:\\path", "héllo ✓ 😀", ""):
        assert printable(text) == text


@given(hostile_text)
def test_printable_is_one_safe_line_and_reversible(text: str) -> None:
    shown = printable(text)
    _assert_safe_single_line(shown)
    if has_unsafe_characters(text):
        assert _unescape(shown) == text
    else:
        assert shown == text


def _record(n: int, capability: str, constraint: str, request_id: str, peer: str) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=1_700_000_000_000 + n,
        request_id=request_id,
        peer_id=peer,
        capability=capability,
        version_constraint=constraint,
        served_version="1.0.0",
        decision="refuse",
        reason="INVALID_REQUEST",
        payload_size=n,
        payload_sha256=hashlib.sha256(str(n).encode()).hexdigest(),
        latency_ms=1.0,
        task_id=capability,
        step_id=constraint,
        seq=n + 1,
    )


records = st.lists(
    st.builds(
        _record, st.integers(0, 10**6), hostile_text, hostile_text, hostile_text, hostile_text
    ),
    max_size=6,
)


@settings(max_examples=200)
@given(records)
def test_audit_table_has_one_line_per_record_and_no_raw_control(rows: list[AuditRecord]) -> None:
    table = format_table(rows)
    assert len(table.splitlines()) == len(rows) + 1
    assert not has_unsafe_characters(table.replace("\n", ""))


@settings(max_examples=200)
@given(records)
def test_audit_json_lines_stay_exact_and_printable(rows: list[AuditRecord]) -> None:
    text = format_json_lines(rows)
    lines = text.splitlines()
    assert len(lines) == len(rows)
    assert not has_unsafe_characters(text.replace("\n", ""))
    assert [json.loads(line) for line in lines] == [row.to_json_dict() for row in rows]


def test_json_for_terminals_keeps_bidi_as_exact_data() -> None:
    value = {"capability": "kv\u202eput\u2066x\u2069\x85\x7f"}
    shown = json_for_terminals(json.dumps(value, ensure_ascii=False))
    assert shown == '{"capability": "kv\\u202eput\\u2066x\\u2069\\u0085\\u007f"}'
    assert json.loads(shown) == value


@given(hostile_text, hostile_text)
def test_log_formatter_escapes_message_and_args(template: str, arg: str) -> None:
    formatter = EscapingFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord(
        "gateway.test",
        logging.WARNING,
        __file__,
        1,
        template.replace("%", "") + " %s",
        (arg,),
        None,
    )
    line = formatter.format(record)
    _assert_safe_single_line(line)
    assert line.startswith("WARNING gateway.test: ")


def test_log_formatter_escapes_each_traceback_line() -> None:
    formatter = EscapingFormatter("%(message)s")
    try:
        raise ValueError("bad \x1b[2J name\u202e")
    except ValueError:
        import sys

        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    lines = formatter.format(record).split("\n")
    assert lines[0] == "failed" and lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad \\x1b[2J name\\u202e"
    assert not any(has_unsafe_characters(line) for line in lines)
