"""The gauges an agent's metrics pull from its parts' own counts at each scrape."""

from __future__ import annotations

from gateway.audit import AuditLog
from gateway.inbound.limits.admission import limit_refusal_counts
from gateway.runtime.status import AgentStatus
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.telemetry.metrics import AgentMetrics
from gateway.transport.live_tls import LiveTls
from policies.store import PolicyStore


def observe_parts(
    metrics: AgentMetrics,
    audit: AuditLog,
    policies: PolicyStore,
    a2a_runs: BackgroundTasks,
    tls: LiveTls,
    status: AgentStatus,
) -> None:
    """Pull gauges over the parts' own counts (one line each; no-ops without metrics)."""
    metrics.observe_gauge(
        "a2agw_audit_queue_depth",
        "Audit records queued, not yet committed",
        lambda: audit.queue_depth,
    )
    metrics.observe_gauge(
        "a2agw_a2a_tasks_running",
        "A2A tasks running in the background in this process (return_immediately, streams)",
        lambda: len(a2a_runs),
    )
    metrics.observe_counter(
        "a2agw_policy_reloads",
        "Policy reloads by result",
        lambda: [
            ({"result": "ok"}, policies.reloads_ok),
            ({"result": "rejected"}, policies.reloads_rejected),
        ],
    )
    # Read at each scrape from the material in force, so a rotated
    # certificate shows its own expiry.
    metrics.observe_gauge(
        "a2agw_certificate_expiry_seconds",
        "When the agent's own certificate expires (Unix time)",
        lambda: tls.current.not_after().timestamp(),
        unit="s",
    )
    metrics.observe_counter(
        "a2agw_limit_refusals",
        "Calls refused by per-peer limits or the server-wide cap, by reason",
        lambda: limit_refusal_counts(status.limit_stats(), by_peer=metrics.peer_labels),
    )
    metrics.observe_counter(
        "a2agw_certificate_reloads",
        "Certificate reloads by result (a rejected set leaves the old one in force)",
        lambda: [
            ({"result": "ok"}, status.tls_stats().reloads_ok),
            ({"result": "rejected"}, status.tls_stats().reloads_rejected),
        ],
    )
    metrics.observe_gauge(
        "a2agw_certificate_expiring_soon",
        "1 while the agent's own certificate expires within [tls] expiry_warning",
        lambda: float(status.tls_stats().expiring_soon),
    )
