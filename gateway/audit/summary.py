"""Refused calls per peer and reason, counting aggregated limit records.

Limit refusals (``RATE_LIMITED``, ``CONCURRENCY_LIMITED``, ``SERVER_BUSY``) are
stored one record per peer and interval with ``count=N`` in the detail (see
``gateway.inbound.limits.refusal_log``); every other record stands for one call.

The count is read only from a refused record of a limit reason whose whole
detail is the aggregator's grammar (:func:`limit_count_detail`). Only the
limit aggregator writes refusals with those reasons, and it writes nothing else
into their detail, so text that reaches other details (an idempotency key, an
operator's reason) cannot pose as a count. A new column was not needed, and
old logs keep their bytes and hashes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.audit.record import AuditRecord
from gateway.display import json_for_terminals, printable
from gateway.errors import ConcurrencyLimited, RateLimited, ServerBusy

LIMIT_REASONS: frozenset[str] = frozenset(
    {RateLimited.reason, ConcurrencyLimited.reason, ServerBusy.reason}
)
"""Reasons whose refusals are aggregated (one record stands for ``count`` calls)."""

_COUNT = re.compile(r"count=([1-9][0-9]{0,17})(?: window_ms=[0-9]{1,18})?")


def limit_count_detail(count: int, window_ms: int | None = None) -> str:
    """The detail of an aggregated limit record: ``count=N`` [`` window_ms=W``]."""
    return f"count={count}" if window_ms is None else f"count={count} window_ms={window_ms}"


def calls_in(record: AuditRecord) -> int:
    """How many calls ``record`` stands for: the count of an aggregated limit
    refusal (see the module doc), else 1."""
    return calls_counted(record.decision, record.reason, record.detail)


def calls_counted(decision: str, reason: str, detail: str) -> int:
    """``calls_in`` for a record given by its three fields (e.g. a row being committed)."""
    if decision != "refuse" or reason not in LIMIT_REASONS:
        return 1
    match = _COUNT.fullmatch(detail)
    return int(match.group(1)) if match else 1


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """Calls of one peer that ended with one decision and reason.

    Attributes:
        peer_id: The caller (``""``: unauthenticated).
        decision: ``allow`` or ``refuse``.
        reason: The reason code (``OK`` for a served call).
        calls: Calls, aggregated records counted by their ``count``.
        records: Audit records they took.
        first_unix_ms: Time of the first record.
        last_unix_ms: Time of the last record.
    """

    peer_id: str
    decision: str
    reason: str
    calls: int
    records: int
    first_unix_ms: int
    last_unix_ms: int


def summarize(records: Sequence[AuditRecord]) -> list[SummaryRow]:
    """One row per (peer, decision, reason), sorted by peer then reason."""
    groups: dict[tuple[str, str, str], list[AuditRecord]] = {}
    for rec in records:
        groups.setdefault((rec.peer_id, rec.decision, rec.reason), []).append(rec)
    return [
        SummaryRow(
            peer_id=peer,
            decision=decision,
            reason=reason,
            calls=sum(calls_in(rec) for rec in group),
            records=len(group),
            first_unix_ms=min(rec.time_unix_ms for rec in group),
            last_unix_ms=max(rec.time_unix_ms for rec in group),
        )
        for (peer, decision, reason), group in sorted(groups.items())
    ]


def format_summary(rows: Sequence[SummaryRow]) -> str:
    """A table of ``rows``; every cell escaped (peer ids are stored text)."""
    header = ["peer", "decision", "reason", "calls", "records", "first", "last"]
    cells = [header] + [
        [
            printable(row.peer_id or "-"),
            row.decision,
            printable(row.reason),
            str(row.calls),
            str(row.records),
            _iso(row.first_unix_ms),
            _iso(row.last_unix_ms),
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return "".join(
        "  ".join(f"{cell:<{width}}" for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in cells
    )


def format_summary_json(rows: Sequence[SummaryRow]) -> str:
    """One JSON object per row and line (exact values, terminal-safe escapes)."""
    return "".join(
        json_for_terminals(
            json.dumps(
                {
                    "peer_id": row.peer_id,
                    "decision": row.decision,
                    "reason": row.reason,
                    "calls": row.calls,
                    "records": row.records,
                    "first_unix_ms": row.first_unix_ms,
                    "last_unix_ms": row.last_unix_ms,
                },
                sort_keys=True,
                ensure_ascii=False,
            )
        )
        + "\n"
        for row in rows
    )


def _iso(time_unix_ms: int) -> str:
    moment = datetime.fromtimestamp(time_unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
