"""What each console page shows, read from the agent and its audit log (never payload content).

Every view is read-only. Reads of the audit store run in a thread (they are
SQLite or PostgreSQL queries); everything else is an in-memory snapshot the
agent already keeps (policy in force, certificate facts, calls in flight).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from gateway.audit import parse_since, query_records, verify_chain
from gateway.audit.record import AuditRecord
from gateway.config import AgentConfig
from gateway.console.chart import bucket_refusals, render_chart
from gateway.console.http import Request
from gateway.console.pages import (
    DECISION_COLUMNS,
    decision_cells,
    esc,
    facts,
    filter_form,
    href,
    table,
    trace_link,
    utc,
)
from gateway.errors import ConfigError
from gateway.inbound.limits import LimitStats
from gateway.postgres.dsn import PostgresDsn
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
    """What the console reads from its agent (``gateway.agent.Agent`` is one)."""

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
    def of(cls, request: Request) -> Filters:
        """Filters from the query string; a bad ``since`` is named, not fatal."""
        since, problem = request.param("since"), ""
        if since:
            try:
                parse_since(since)
            except ConfigError as err:
                since, problem = "", err.message
        return cls(
            peer=request.param("peer"),
            capability=request.param("capability"),
            reason=request.param("reason").upper(),
            since=since,
            trace=request.param("trace").lower(),
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


def _agent_filter(config: AgentConfig) -> str | None:
    return config.id if isinstance(config.audit_db, PostgresDsn) else None


async def _records(
    config: AgentConfig, wanted: Filters, *, refusals: bool = False, default_since: str = ""
) -> list[AuditRecord]:
    since_text = wanted.since or default_since
    found = await asyncio.to_thread(
        query_records,
        config.audit_db,
        agent=_agent_filter(config),
        refusals_only=refusals,
        peer=wanted.peer or None,
        capability=wanted.capability or None,
        since=parse_since(since_text) if since_text else None,
        trace_id=wanted.trace or None,
        limit=_SCAN_ROWS if wanted.reason or refusals else RECENT_ROWS,
    )
    return [rec for rec in found if wanted.matches(rec)]


async def decisions(source: ConsoleSource, request: Request) -> str:
    """Recent decisions, newest first; the live script adds new ones at the top."""
    wanted = Filters.of(request)
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


async def refusals(source: ConsoleSource, request: Request) -> str:
    """Refusals by peer and reason over the window (default the last hour)."""
    wanted = Filters.of(request)
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


def grants(source: ConsoleSource) -> str:
    """The grants in force: capabilities, caps, expiry and limits."""
    now = datetime.now(UTC)
    rows = []
    for grant in source.policies.current.document.grants:
        left = grant.expires_at - now
        expiry = esc(grant.expires_at.isoformat())
        status = "expired" if left <= timedelta(0) else f"{left.days}d left"
        limits = [
            f"{name} {value:g}"
            for name, value in (
                ("max_calls_per_second", grant.max_calls_per_second),
                ("burst", grant.burst),
                ("max_in_flight", grant.max_in_flight),
            )
            if value is not None
        ]
        rows.append(
            [
                f'<a href="{href("/", {"peer": grant.peer})}">{esc(grant.peer)}</a>',
                esc(", ".join(str(entry) for entry in grant.capabilities)),
                esc(grant.max_risk.value if grant.max_risk else "-"),
                esc(grant.max_payload_bytes),
                f'{expiry} <span class="{"expired" if left <= timedelta(0) else "ok"}">'
                f"({esc(status)})</span>",
                esc("; ".join(limits) or "-"),
            ]
        )
    headers = ("Peer", "Capabilities", "Max risk", "Payload cap", "Expires", "Limits")
    return table(headers, rows)


def certificate(source: ConsoleSource) -> str:
    """The agent's own certificate: serial, expiry, reloads (never the key or the PEM)."""
    stats = source.tls_stats()
    not_after = datetime.fromtimestamp(stats.not_after_unix, UTC)
    left = not_after - datetime.now(UTC)
    warn = ' <span class="expired">(expires soon)</span>' if stats.expiring_soon else ""
    return facts(
        [
            ("SPIFFE ID", esc(source.config.id)),
            ("Serial", esc(f"{stats.serial:x}")),
            ("Expires", f"{esc(not_after.isoformat())} ({esc(left.days)}d left){warn}"),
            ("Reloads taken / rejected", esc(f"{stats.reloads_ok} / {stats.reloads_rejected}")),
            ("Certificate file", esc(source.config.tls.cert)),
        ]
    )


async def upstreams(source: ConsoleSource) -> str:
    """Each ``[[upstreams]]`` entry and the last outcome of each of its skills."""
    rows = []
    for upstream in source.config.upstreams:
        for skill in upstream.skills:
            last = await asyncio.to_thread(
                query_records,
                source.config.audit_db,
                agent=_agent_filter(source.config),
                capability=skill.capability,
                limit=1,
            )
            outcome = "-"
            if last:
                rec = last[-1]
                outcome = (
                    f"{esc(rec.decision)} {esc(rec.reason)} at {esc(utc(rec.time_unix_ms))} "
                    f"(trace {trace_link(rec.trace_id)})"
                )
            rows.append(
                [
                    esc(upstream.name),
                    esc(upstream.binding),
                    esc(upstream.address or upstream.url or "-"),
                    f'<a href="{href("/", {"capability": skill.capability})}">'
                    f"{esc(skill.capability)}</a>",
                    outcome,
                ]
            )
    if not rows:
        return '<p class="empty">This agent fronts no upstream A2A agents.</p>'
    return table(("Upstream", "Binding", "Address", "Capability", "Last outcome"), rows)


async def audit_status(source: ConsoleSource, request: Request) -> str:
    """Chain length, last record, last signed checkpoint; the full check on request."""
    config = source.config
    last = await asyncio.to_thread(
        query_records, config.audit_db, agent=_agent_filter(config), limit=1
    )
    checkpoint = await asyncio.to_thread(_last_checkpoint, config.checkpoint_file)
    health = source.health_state()
    rows = [
        ("Audit log", esc(config.audit_db)),
        ("Health", esc("SERVING" if health.serving else f"NOT_SERVING: {health.why_not()}")),
        ("Records", esc(last[-1].seq if last else 0)),
        ("Last record", esc(utc(last[-1].time_unix_ms)) if last else "-"),
        ("Checkpoint file", esc(config.checkpoint_file)),
    ]
    if checkpoint is None:
        rows.append(("Last checkpoint", "none yet"))
    else:
        seq, when = checkpoint
        behind = (last[-1].seq if last else 0) - seq
        rows.append(("Last checkpoint", esc(f"seq {seq} at {utc(when)}; {behind} record(s) since")))
    if request.param("verify") == "1" and not isinstance(config.audit_db, PostgresDsn):
        report = await asyncio.to_thread(verify_chain, config.audit_db)
        verdict = (
            f"intact ({report.records} records)"
            if report.ok
            else f"BROKEN: {len(report.problems)} problem(s), first at seq {report.problems[0].seq}"
        )
        rows.append(("Chain check", esc(verdict)))
    else:
        rows.append(("Chain check", '<a href="/audit?verify=1">verify the hash chain now</a>'))
    return facts(rows)


def _last_checkpoint(path: Path) -> tuple[int, int] | None:
    """(seq, time_unix_ms) of the file's last line, if it has a readable one."""
    try:
        with path.open("rb") as file:
            file.seek(0, 2)
            file.seek(max(0, file.tell() - 8192))
            lines = file.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
            return int(entry["seq"]), int(entry["time_unix_ms"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def in_flight(source: ConsoleSource) -> str:
    """Calls (Invoke and A2A tasks) running now, per peer."""
    stats = source.limit_stats()
    rows = [
        [f'<a href="{href("/", {"peer": peer})}">{esc(peer)}</a>', esc(count)]
        for peer, count in sorted(stats.in_flight.items())
        if count
    ]
    summary = facts(
        [
            ("Running now", esc(stats.in_flight_total)),
            ("Server-wide cap", esc(stats.max_concurrent_calls)),
            ("Limit refusals since start", esc(stats.refused_total)),
        ]
    )
    return summary + table(("Peer", "Calls and A2A tasks in flight"), rows)
