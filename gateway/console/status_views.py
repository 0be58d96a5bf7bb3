"""The status pages of the console: grants, certificate, upstreams, audit chain, in flight.

Snapshots the agent already keeps (policy in force, certificate facts, calls
in flight), plus a few small reads of the audit store, in a thread. Never
payload content, keys or certificate PEM.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gateway.audit import query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.audit.store.sqlite_schema import TIME_RANGE_MS
from gateway.config import TlsFiles, TlsSettings
from gateway.console.http import Query
from gateway.console.pages import (
    cell,
    esc,
    facts,
    href,
    problem_note,
    span_text,
    table,
    trace_link,
    utc,
)
from gateway.console.views import ConsoleSource, agent_filter
from gateway.errors import ConfigError
from gateway.inbound.in_flight import RunningCall
from gateway.storage import open_audit_reader


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
            ("Certificate", esc(_certificate_source(source.config.tls))),
        ]
    )


def _certificate_source(tls: TlsSettings) -> str:
    if isinstance(tls, TlsFiles):
        return f"file {tls.cert}"
    return f"SPIFFE Workload API {tls.socket or '(SPIFFE_ENDPOINT_SOCKET)'}"


async def upstreams(source: ConsoleSource) -> str:
    """Each ``[[upstreams]]`` entry and the last outcome of each of its skills."""
    rows = []
    for upstream in source.config.upstreams:
        for skill in upstream.skills:
            last = await asyncio.to_thread(
                query_records,
                open_audit_reader(source.config.audit_db),
                AuditFilter(
                    agent=agent_filter(source.config), capability=skill.capability, limit=1
                ),
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


async def audit_status(source: ConsoleSource, query: Query) -> str:
    """Chain length, last record, last signed checkpoint; the full check on request."""
    config = source.config
    log = open_audit_reader(config.audit_db)
    last = await asyncio.to_thread(
        query_records, log, AuditFilter(agent=agent_filter(config), limit=1)
    )
    records = last[-1].seq if last else 0
    checkpoint = await _checkpoint_fact(config.checkpoint_file, records)
    health = source.health_state()
    rows = [
        ("Audit log", esc(config.audit_db)),
        ("Health", esc("SERVING" if health.serving else f"NOT_SERVING: {health.why_not()}")),
        ("Records", esc(records)),
        ("Last record", esc(utc(last[-1].time_unix_ms)) if last else "-"),
        ("Checkpoint file", esc(config.checkpoint_file)),
        ("Last checkpoint", checkpoint),
    ]
    if query.param("verify") == "1" and not log.many_chains:
        report = await asyncio.to_thread(verify_chain, log)
        verdict = (
            f"intact ({report.records} records)"
            if report.ok
            else f"BROKEN: {len(report.problems)} problem(s), first at seq {report.problems[0].seq}"
        )
        rows.append(("Chain check", esc(verdict)))
    else:
        rows.append(("Chain check", '<a href="/audit?verify=1">verify the hash chain now</a>'))
    return facts(rows)


async def _checkpoint_fact(path: Path, records: int) -> str:
    """The last checkpoint and how far the log is past it, as page HTML."""
    try:
        checkpoint = await asyncio.to_thread(_last_checkpoint, path)
    except ConfigError as err:  # named in its row: the rest of the page still holds
        return problem_note(err.message)
    if checkpoint is None:
        return "none yet"
    seq, when = checkpoint
    return esc(f"seq {seq} at {utc(when)}; {records - seq} record(s) since")


def _last_checkpoint(path: Path) -> tuple[int, int] | None:
    """(seq, time_unix_ms) of the file's last checkpoint line, if it has one.

    Lines that are not JSON objects with both fields are passed over: the
    tail read may begin mid-line, and a line may be half written.

    Raises:
        ConfigError: That line's seq or time is no number a checkpoint could
            hold (the file was altered).
    """
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
            seq, when = entry["seq"], entry["time_unix_ms"]
        except (ValueError, KeyError, TypeError, RecursionError):  # Recursion: nested too deep
            continue
        if type(seq) is not int or seq < 0 or type(when) is not int or not _in_range(when):
            raise ConfigError(
                f"checkpoint file {path}: its last checkpoint cannot be read (seq or "
                "time_unix_ms is not a whole number in range); check the file with: "
                "a2a-gateway audit verify --config AGENT.toml"
            )
        return seq, when
    return None


def _in_range(time_unix_ms: int) -> bool:
    return TIME_RANGE_MS[0] <= time_unix_ms <= TIME_RANGE_MS[1]


def in_flight(source: ConsoleSource) -> str:
    """Calls (Invoke and A2A tasks) running now, one row each, the longest running first.

    Each row: the peer, capability and version, binding, task, how long it has
    run, and the last progress its capability reported to the watching caller
    (shown here only: the console already shows every decision).
    """
    stats = source.limit_stats()
    running = source.calls_in_flight()
    summary = facts(
        [
            ("Running now", esc(stats.in_flight_total)),
            ("Server-wide cap", esc(stats.max_concurrent_calls)),
            ("Limit refusals since start", esc(stats.refused_total)),
        ]
    )
    note = ""
    if source.config.workers > 1:
        note = (
            '<p class="note">The rows are the calls of the worker that serves this console; '
            "the count above is of every worker.</p>"
        )
    if not running.calls:
        return summary + note + '<p class="empty">No call is running now.</p>'
    rows = [_in_flight_row(call, running.now) for call in running.calls]
    headers = ("Peer", "Capability", "Binding", "Task", "Running for", "Progress")
    return summary + note + table(headers, rows, body_id="in-flight-rows")


def _in_flight_row(call: RunningCall, now: float) -> list[str]:
    progress = "-"
    if call.progress_at:
        progress = (
            f'{cell(call.progress, 60)} <span class="age">'
            f"({esc(span_text(now - call.progress_at))} ago)</span>"
        )
    return [
        f'<a href="{href("/", {"peer": call.peer_id})}">{cell(call.peer_id, 44)}</a>',
        f'{cell(call.capability, 32)} <span class="version">{esc(call.version)}</span>',
        esc(call.binding or "-"),
        cell(call.task_id or "-", 14),
        esc(span_text(now - call.started)),
        progress,
    ]
