"""Everything one agent reports about itself: metrics, spans, the /metrics endpoint."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import INVALID_SPAN, Span
from opentelemetry.util.types import AttributeValue

from gateway.config import MetricsSettings, TracingSettings
from gateway.telemetry.health_http import HealthSource
from gateway.telemetry.metrics import AgentMetrics
from gateway.telemetry.metrics_server import MetricsServer
from gateway.telemetry.tracing import AgentTracing, CurrentSpan, Metadata, carries_trace_context


class Telemetry:
    """One agent's metrics and tracing, and its Prometheus endpoint when configured.

    Attributes:
        metrics: Instruments and pull gauges (no-op without ``[metrics]``).
        tracing: Spans (no-op without ``[tracing]``, but trace context is carried).
    """

    def __init__(
        self,
        agent_id: str,
        metrics: MetricsSettings | None = None,
        tracing: TracingSettings | None = None,
        *,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        self.metrics = AgentMetrics(agent_id, metrics)
        self.tracing = AgentTracing(agent_id, tracing, span_exporter)
        self._server = (
            None
            if metrics is None
            else MetricsServer(
                metrics.listen, self.metrics.prometheus_text, any_host=metrics.allow_remote
            )
        )
        self._quiet = not (self.metrics.enabled or self.tracing.enabled)

    @classmethod
    def off(cls, agent_id: str = "") -> Telemetry:
        """No metrics, no spans (trace context is still carried)."""
        return cls(agent_id)

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the /metrics endpoint once started; None when off."""
        return None if self._server is None or not self._server.port else self._server.address

    def inbound(
        self, operation: str, metadata: Metadata | None, attributes: Mapping[str, AttributeValue]
    ) -> InboundCall | _UnobservedCall:
        """One inbound RPC: counted in flight, a server span under the caller's trace.

        With metrics and spans off and no trace context in ``metadata`` there
        is nothing to count, record or carry: the call gets a shared no-op
        (the audit record still reads the current trace id, as before).
        """
        if self._quiet and not carries_trace_context(metadata):
            return _UNOBSERVED
        return InboundCall(
            self.metrics, self.tracing.inbound(operation, metadata, attributes), operation
        )

    def serve_health(self, source: HealthSource) -> None:
        """Answer ``/healthz`` and ``/readyz`` on the /metrics listener from ``source``."""
        if self._server is not None:
            self._server.health = source

    @property
    def metrics_port(self) -> int:
        """The /metrics port once started (0 when metrics are off)."""
        return 0 if self._server is None else self._server.port

    async def start(self) -> None:
        """Serve /metrics if configured."""
        if self._server is not None:
            await self._server.start()

    async def stop(self) -> None:
        """Stop serving and flush spans."""
        if self._server is not None:
            await self._server.stop()
        self.tracing.shutdown()
        self.metrics.shutdown()


class _UnobservedCall:
    """``with``: nothing; the span it yields is the API's invalid (non-recording) span."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_UNOBSERVED = _UnobservedCall()


class InboundCall:
    """``with``: one call in flight and its server span (a class: it runs per call)."""

    __slots__ = ("_metrics", "_operation", "_span")

    def __init__(self, metrics: AgentMetrics, span: CurrentSpan, operation: str) -> None:
        self._metrics, self._span, self._operation = metrics, span, operation

    def __enter__(self) -> Span:
        self._metrics.call_started(self._operation)
        return self._span.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            self._span.__exit__(*exc)
        finally:
            self._metrics.call_ended(self._operation)
