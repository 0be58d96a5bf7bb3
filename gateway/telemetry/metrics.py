"""One agent's metrics: its own MeterProvider, the gateway's instruments, pull gauges.

Several agents may run in one process (tests, the demo), so nothing here uses
the global OpenTelemetry provider. Without ``[metrics]`` every instrument is
the API's no-op instrument and nothing is collected.

Components keep their own counts (the policy store its reloads, the audit log
its queue); telemetry *pulls* them when scraped, through observable
instruments. Adding one is one line::

    metrics.observe_counter("a2agw_policy_reloads", "Policy reloads by result",
                            lambda: [({"result": "ok"}, store.reloads_ok)])

Label values come from bounded sets only: callers choose the capability name
they send, so a name that is not registered here is counted under
``OTHER_CAPABILITY`` (one series, however many names a caller invents).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from gateway.audit.summary import calls_counted
from gateway.config import MetricsSettings
from gateway.telemetry.prometheus_text import render

Labels = Mapping[str, str]
Reading = Callable[[], float | Iterable[tuple[Labels, float]]]
"""What an observable instrument reads: one value, or (labels, value) pairs."""

ADMITTED = "ADMITTED"
OTHER_CAPABILITY = "_other"
"""The ``capability`` label of calls naming a capability not registered here."""
_DECISION_LABELS = ("capability", "decision", "reason", "peer")
# Seconds; from sub-millisecond local calls to the longest capability timeouts.
_DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
_COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class AgentMetrics:
    """The metrics of one agent (no-op unless ``settings`` is given).

    Attributes:
        enabled: True when metrics are collected (``[metrics]`` configured).
        peer_labels: Decisions and durations carry a ``peer`` label.
    """

    def __init__(self, agent_id: str, settings: MetricsSettings | None) -> None:
        self.enabled = settings is not None
        self.peer_labels = settings is not None and settings.peer_labels
        self._reader: InMemoryMetricReader | None = None
        self._provider: MeterProvider | None = None
        if settings is None:
            meter: Meter = NoOpMeterProvider().get_meter("a2agw")
        else:
            self._reader = InMemoryMetricReader()
            self._provider = MeterProvider(
                metric_readers=[self._reader],
                resource=Resource.create({"service.name": "a2a-gateway", "agent.id": agent_id}),
            )
            meter = self._provider.get_meter("a2agw")
        self._meter = meter
        # Hot-path counts are plain ints, pulled at scrape time: an SDK
        # instrument call costs ~10 us, a dict increment well under one.
        self._decision_counts: dict[tuple[str, ...], int] = {}
        # "": records of calls that name no capability (Describe, aggregated limit refusals).
        self._capabilities: frozenset[str] = frozenset({""})
        self._in_flight: dict[str, int] = {}
        self.observe_counter(
            "a2agw_decisions",
            "Audited decisions (one per committed audit record)",
            self._decision_readings,
        )
        self.observe_gauge(
            "a2agw_calls_in_flight",
            "Inbound calls being handled now",
            lambda: [({"operation": op}, n) for op, n in list(self._in_flight.items())],
        )
        self._duration = meter.create_histogram(
            "a2agw_call_duration_seconds",
            unit="s",
            description="Call time from arrival to decision or completion (outcome records)",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._commit = meter.create_histogram(
            "a2agw_audit_commit_seconds",
            unit="s",
            description="Time to commit one batch of audit records",
            explicit_bucket_boundaries_advisory=_COMMIT_BUCKETS,
        )
        self._steps = meter.create_counter(
            "a2agw_plan_steps", description="Plan steps finished, by outcome"
        )

    # --- pull: one line per component stat ----------------------------------

    def observe_gauge(self, name: str, description: str, read: Reading, unit: str = "") -> None:
        """Register a gauge whose value ``read()`` returns at each scrape."""
        if self.enabled:
            self._meter.create_observable_gauge(
                name, [_callback(read)], unit=unit, description=description
            )

    def observe_counter(self, name: str, description: str, read: Reading, unit: str = "") -> None:
        """Register a counter (``_total`` in Prometheus) whose running total ``read()`` returns."""
        if self.enabled:
            self._meter.create_observable_counter(
                name, [_callback(read)], unit=unit, description=description
            )

    def label_capabilities(self, names: Iterable[str]) -> None:
        """Take ``names`` (the registered capabilities) as the ``capability`` label values.

        Every other name a record carries is labelled ``OTHER_CAPABILITY``.
        """
        self._capabilities = frozenset(names) | {""}

    # --- push: events the gateway sees as they happen -----------------------

    def audit_committed(self, records: Sequence[Mapping[str, object]], seconds: float) -> None:
        """Count a committed audit batch (called by the audit writer thread).

        Counting committed records, not attempted ones, keeps
        ``a2agw_decisions_total`` equal to the audit log's counts; an aggregated
        limit record (``count=N`` in its detail) counts its N calls.
        """
        if not self.enabled:
            return
        self._commit.record(seconds)
        counts, known = self._decision_counts, self._capabilities
        for rec in records:
            capability, decision, reason = (
                str(rec["capability"]),
                str(rec["decision"]),
                str(rec["reason"]),
            )
            if capability not in known:
                capability = OTHER_CAPABILITY
            key: tuple[str, ...] = (capability, decision, reason)
            if self.peer_labels:
                key += (str(rec["peer_id"]),)
            counts[key] = counts.get(key, 0) + calls_counted(
                decision, reason, str(rec.get("detail", ""))
            )
            if reason != ADMITTED:  # the write-ahead record is not an outcome
                labels = {"capability": capability, "decision": decision}
                if self.peer_labels:
                    labels["peer"] = str(rec["peer_id"])
                self._duration.record(float(str(rec["latency_ms"])) / 1000.0, labels)

    def _decision_readings(self) -> list[tuple[Labels, float]]:
        # list() of a dict's items is one step under the GIL: safe while the
        # writer thread adds keys.
        readings: list[tuple[Labels, float]] = []
        for key, count in list(self._decision_counts.items()):
            labels = dict(zip(_DECISION_LABELS, key, strict=False))
            readings.append((labels, count))
        return readings

    def call_started(self, operation: str) -> None:
        """One more inbound call in flight (event loop thread only)."""
        if self.enabled:
            self._in_flight[operation] = self._in_flight.get(operation, 0) + 1

    def call_ended(self, operation: str) -> None:
        """One inbound call fewer in flight (event loop thread only)."""
        if self.enabled:
            self._in_flight[operation] -= 1

    def plan_step(self, outcome: str, reason: str) -> None:
        """Count one finished plan step (``completed``/``failed`` and its reason)."""
        self._steps.add(1, {"outcome": outcome, "reason": reason})

    # --- exposition ---------------------------------------------------------

    def prometheus_text(self) -> str:
        """Everything collected so far in the Prometheus text format."""
        if self._reader is None:
            return ""
        return render(self._reader.get_metrics_data())

    def shutdown(self) -> None:
        """Stop the provider (idempotent)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None


def _callback(read: Reading) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        value = read()
        if isinstance(value, int | float):
            return [Observation(value)]
        return [Observation(amount, dict(labels)) for labels, amount in value]

    return observe
