"""Read an audit log: filter records and render them for people or for tools."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gateway.audit.filter import AuditFilter
from gateway.audit.record import AuditRecord
from gateway.display import json_for_terminals, printable
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.audit.store.store import AuditReader

_SINCE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_YEAR_1 = datetime.min.replace(tzinfo=UTC)
_MAX_DIGITS = 18
"""More digits than any count a timedelta holds (999,999,999 days is 14 digits of seconds)."""

TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("TIME (UTC)", "<"),
    ("PEER", "<"),
    ("CAPABILITY", "<"),
    ("CONSTRAINT", "<"),
    ("SERVED", "<"),
    ("DECISION", "<"),
    ("REASON", "<"),
    ("SIZE", ">"),
    ("LATENCY MS", ">"),
    ("REQUEST ID", "<"),
    ("TRACE ID", "<"),
)


def parse_since(text: str) -> timedelta:
    """Parse a look-back window such as ``"30s"``, ``"10m"``, ``"2h"`` or ``"1d"``.

    Raises:
        ConfigError: ``text`` is not a positive whole number followed by one of
            ``s``, ``m``, ``h``, ``d``, or reaches back before the year 1.
    """
    match = _SINCE.fullmatch(text.strip())
    window = _window(match.group(1), match.group(2)) if match is not None else timedelta(0)
    if window == timedelta(0):
        raise ConfigError(
            f"--since {text!r}: expected a positive number and a unit s, m, h or d (e.g. 10m)"
        )
    if window is None or window > datetime.now(UTC) - _YEAR_1:
        raise ConfigError(f"--since {text!r}: too far back (it reaches before the year 1)")
    return window


def _window(digits: str, unit: str) -> timedelta | None:
    """The window, or None if no timedelta holds it (nor would int() read so many digits)."""
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        return None
    try:
        return timedelta(**{_UNITS[unit]: int(digits)})
    except OverflowError:
        return None


def query_records(reader: AuditReader, wanted: AuditFilter | None = None) -> list[AuditRecord]:
    """Records of the store ``reader`` reads that match ``wanted`` (default: all).

    A SQLite file gives them in seq order; a store of many chains by time (see
    :func:`gateway.audit.store.postgres.query_agent_records` for the agent of each).

    Raises:
        ConfigError: The store is missing or not an audit log, holds a record
            that cannot be read (altered: see ``audit verify``), or
            ``wanted.limit`` < 0.
    """
    return reader.query(wanted if wanted is not None else AuditFilter())


def recent_request_ids(
    reader: AuditReader,
    *,
    agent: str,
    since: timedelta,
    limit: int,
    refusals: Collection[str],
) -> Iterator[tuple[str, str, int]]:
    """(peer, request id, time_unix_ms) of the most recent calls that were allowed
    or refused for one of ``refusals``, newest first, at most ``limit``.

    Streamed in pages rather than read as one list: after a restart an agent
    reloads up to its whole replay window (millions of ids) this way, and only
    these three columns ever leave the database.

    Raises:
        ConfigError: The log cannot be read.
    """
    return reader.recent_request_ids(agent=agent, since=since, limit=limit, refusals=refusals)


def format_table(records: Sequence[AuditRecord]) -> str:
    """A fixed-width table of ``records``, one line each under a header line.

    Every cell goes through ``printable``: ids and names are whatever peers
    sent (or whatever an older writer stored), and a newline, CR, ESC or bidi
    override in one must not forge a row or rewrite the operator's terminal.
    """
    cells = [[title for title, _ in TABLE_COLUMNS]] + [table_cells(rec) for rec in records]
    widths = [max(len(row[i]) for row in cells) for i in range(len(TABLE_COLUMNS))]
    lines = [
        "  ".join(
            f"{cell:{align}{width}}"
            for cell, (_, align), width in zip(row, TABLE_COLUMNS, widths, strict=True)
        ).rstrip()
        for row in cells
    ]
    return "\n".join(lines) + "\n"


def format_json_lines(records: Sequence[AuditRecord]) -> str:
    """One compact JSON object per record and line, with every field.

    Values stay exact; characters that could break a line or drive a terminal
    are written as JSON ``\\u`` escapes (``json_for_terminals``).
    """
    return "".join(
        json_for_terminals(json.dumps(rec.to_json_dict(), sort_keys=True, ensure_ascii=False))
        + "\n"
        for rec in records
    )


def table_cells(rec: AuditRecord) -> list[str]:
    """The cells of ``rec``'s row in :func:`format_table`, each escaped by ``printable``."""
    cells = [
        _utc_iso(rec.time_unix_ms),
        rec.peer_id or "-",
        rec.capability or "-",
        rec.version_constraint or "-",
        rec.served_version or "-",
        rec.decision,
        rec.reason,
        str(rec.payload_size),
        f"{rec.latency_ms:.1f}",
        rec.request_id,
        rec.trace_id or "-",
    ]
    return [printable(cell) for cell in cells]


def _utc_iso(time_unix_ms: int) -> str:
    moment = datetime.fromtimestamp(time_unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
