"""Refused calls per peer and reason, counting aggregated limit records.

Limit refusals (``RATE_LIMITED``, ``CONCURRENCY_LIMITED``, ``SERVER_BUSY``) are
stored one record per peer and interval with ``count=N`` in the detail (see
``gateway.inbound.limit_audit``); every other record stands for one call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.audit.record import AuditRecord
from gateway.display import json_for_terminals, printable

_COUNT = re.compile(r"(?:^|\s)count=([0-9]+)(?:\s|$)")


def calls_in(record: AuditRecord) -> int:
    """How many calls ``record`` stands for: ``count=N`` in its detail, else 1."""
    return calls_in_detail(record.detail)


def calls_in_detail(detail: str) -> int:
    """How many calls a record with ``detail`` stands for: ``count=N`` in it, else 1."""
    match = _COUNT.search(detail)
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
