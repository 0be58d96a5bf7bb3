"""The record pages of the console: live decisions and refusals over time, with filters.

Every view is read-only. Reads of the audit store run in a thread (they are
SQLite or PostgreSQL queries). Also defines what the console reads from its
agent (:class:`ConsoleSource`); the status pages are in ``status_views``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from gateway.audit import parse_since, query_records
from gateway.audit.filter import AuditFilter
from gateway.audit.record import AuditRecord
from gateway.config import AgentConfig
from gateway.console.chart import bucket_refusals, render_chart
from gateway.console.http import Query
from gateway.console.pages import (
    DECISION_COLUMNS,
    decision_cells,
    esc,
    filter_form,
    href,
    table,
)
from gateway.errors import ConfigError
from gateway.inbound.in_flight import InFlightCalls
from gateway.inbound.limits.admission import LimitStats
from gateway.storage import open_audit_reader
from gateway.telemetry.health_http import HealthState
from gateway.transport.live_tls import TlsStats
from policies.policy_file import Policy

RECENT_ROWS = 100
_SCAN_ROWS = 5000


class PolicySource(Protocol):
    """The policy in force."""

    @property
    def current(self) -> Policy:
        """The policy in force now."""


class ConsoleSource(Protocol):
    """What the console reads from its agent (``gateway.runtime.agent.Agent`` is one)."""

    @property
    def config(self) -> AgentConfig:
        """The agent's config."""

    @property
    def policies(self) -> PolicySource:
        """The policy in force."""

    def tls_stats(self) -> TlsStats:
        """Certificate facts and reloads."""

    def limit_stats(self) -> LimitStats:
        """Calls in flight and limit refusals."""

    def calls_in_flight(self) -> InFlightCalls:
        """The calls running now, one row each."""

    def health_state(self) -> HealthState:
        """What the gRPC health service says."""


@dataclass(frozen=True, slots=True)
class Filters:
    """The filters of a decisions or refusals view (``""``: any)."""

    peer: str = ""
    capability: str = ""
    reason: str = ""
    since: str = ""
    trace: str = ""
    problem: str = ""

    @classmethod
    def of(cls, query: Query) -> Filters:
        """Filters from the query string; a bad ``since`` is named, not fatal."""
        since, problem = query.param("since"), ""
        if since:
            try:
                parse_since(since)
            except ConfigError as err:
                since, problem = "", err.message
        return cls(
            peer=query.param("peer"),
            capability=query.param("capability"),
            reason=query.param("reason").upper(),
            since=since,
            trace=query.param("trace").lower(),
            problem=problem,
        )

    def values(self) -> dict[str, str]:
        """The filters as query parameters."""
        return {
            "peer": self.peer,
            "capability": self.capability,
            "reason": self.reason,
            "since": self.since,
            "trace": self.trace,
        }

    def matches(self, rec: AuditRecord) -> bool:
        """Whether ``rec`` passes every filter but ``since`` (the live stream's test)."""
        return (
            (not self.peer or rec.peer_id == self.peer)
            and (not self.capability or rec.capability == self.capability)
            and (not self.reason or rec.reason == self.reason)
            and (not self.trace or rec.trace_id == self.trace)
        )


def agent_filter(config: AgentConfig) -> str | None:
    """The agent whose chain to read: its id in a shared PostgreSQL table, else None."""
    return config.id if open_audit_reader(config.audit_db).many_chains else None


async def _records(
    config: AgentConfig, wanted: Filters, *, refusals: bool = False, default_since: str = ""
) -> list[AuditRecord]:
    since_text = wanted.since or default_since
    found = await asyncio.to_thread(
        query_records,
        open_audit_reader(config.audit_db),
        AuditFilter(
            agent=agent_filter(config),
            refusals_only=refusals,
            peer=wanted.peer or None,
            capability=wanted.capability or None,
            since=parse_since(since_text) if since_text else None,
            trace_id=wanted.trace or None,
            limit=_SCAN_ROWS if wanted.reason or refusals else RECENT_ROWS,
        ),
    )
    return [rec for rec in found if wanted.matches(rec)]


async def decisions(source: ConsoleSource, query: Query) -> str:
    """Recent decisions, newest first; the live script adds new ones at the top."""
    wanted = Filters.of(query)
    records = (await _records(source.config, wanted))[-RECENT_ROWS:]
    rows = [decision_cells(rec) for rec in reversed(records)]
    stream = href("/events", wanted.values())
    scope = f"trace {esc(wanted.trace)}: " if wanted.trace else ""
    return (
        filter_form("/", wanted.values(), wanted.problem)
        + f'<p class="live">{scope}<span id="live-state">connecting…</span> '
        f"(newest first; new records appear as they commit)</p>"
        + f'<div id="decisions" data-events="{stream}">'
        + table(DECISION_COLUMNS, rows, body_id="decision-rows")
        + "</div>"
    )


async def refusals(source: ConsoleSource, query: Query) -> str:
    """Refusals by peer and reason over the window (default the last hour)."""
    wanted = Filters.of(query)
    window = parse_since(wanted.since or "1h")
    records = await _records(source.config, wanted, refusals=True, default_since="1h")
    end_ms = int(time.time() * 1000) + 1
    start_ms = end_ms - int(window.total_seconds() * 1000)
    series = bucket_refusals(records, start_ms, end_ms)
    totals = [
        [
            f'<a href="{href("/", {"peer": s.peer, "reason": s.reason})}">{esc(s.peer)}</a>',
            esc(s.reason),
            esc(s.total),
        ]
        for s in series
    ]
    return (
        filter_form("/refusals", wanted.values(), wanted.problem)
        + render_chart(series, start_ms, end_ms)
        + table(("Peer", "Reason", "Refusals"), totals)
    )
