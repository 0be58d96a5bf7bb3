"""One agent's spans and the W3C ``traceparent`` carried in gRPC metadata.

Each agent has its own TracerProvider (several run in one process). Without
``[tracing]`` the tracer is the API's no-op tracer, which still carries an
incoming trace context: the next hop and the audit record see the caller's
trace id even when this agent records no span.

Span attributes are ids, names, versions, sizes and reason codes only, never
payload content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gateway.config import TracingSettings
from gateway.errors import GatewayError
from gateway.telemetry.span_export import BackoffExporter, StderrSpanExporter

OTLP_TIMEOUT_SECONDS = 5
"""One export's budget, retries included (off the call path, in the batch thread)."""
_PROPAGATOR = TraceContextTextMapPropagator()
_CARRIED = frozenset({"traceparent", "tracestate"})

Metadata = Sequence[tuple[str, str | bytes]]
"""gRPC invocation metadata (keys are lower case)."""


class AgentTracing:
    """Spans of one agent; no-op (but still propagating) unless enabled.

    Attributes:
        enabled: Spans are recorded.
    """

    def __init__(
        self,
        agent_id: str,
        settings: TracingSettings | None,
        exporter: SpanExporter | None = None,
    ) -> None:
        """Build the agent's tracer.

        Args:
            agent_id: Recorded as the ``agent.id`` resource attribute.
            settings: ``[tracing]``; None or ``enabled = false`` records nothing.
            exporter: Extra exporter, fed in batches like OTLP and flushed by
                :meth:`shutdown` (tests use the SDK's in-memory exporter);
                turns spans on by itself.
        """
        wanted = exporter is not None or (settings is not None and settings.enabled)
        self.enabled = wanted
        self._provider: TracerProvider | None = None
        if not wanted:
            self._tracer: trace.Tracer = trace.NoOpTracer()
            return
        ratio = 1.0 if settings is None else settings.sample_ratio
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": "a2a-gateway", "agent.id": agent_id}),
            sampler=ParentBased(TraceIdRatioBased(ratio)),
        )
        if exporter is not None:  # batched off the call path; shutdown() flushes
            self._provider.add_span_processor(BatchSpanProcessor(exporter))
        if settings is not None and settings.otlp_endpoint:
            self._provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(settings)))
        if settings is not None and settings.console:
            self._provider.add_span_processor(BatchSpanProcessor(StderrSpanExporter()))
        self._tracer = self._provider.get_tracer("a2agw")

    def inbound(
        self, name: str, metadata: Metadata | None, attributes: Mapping[str, AttributeValue]
    ) -> CurrentSpan:
        """A server span for one inbound RPC, child of the caller's ``traceparent``."""
        carrier = {
            key: value if isinstance(value, str) else value.decode("latin-1")
            for key, value in metadata or ()
            if key in _CARRIED
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        return CurrentSpan(self._tracer, name, SpanKind.SERVER, attributes, parent)

    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> CurrentSpan:
        """A child span of the current one (plan step, peer call)."""
        return CurrentSpan(self._tracer, name, kind, attributes, None)

    def shutdown(self) -> None:
        """Flush and stop exporting (idempotent)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None


class CurrentSpan:
    """``with``: start a span, make it current, end it on exit.

    What ``start_as_current_span`` does, without its two nested generator
    context managers (this runs once or twice per call). An exception is
    not recorded on the span: its message is not ours to export.
    """

    __slots__ = ("_attributes", "_kind", "_name", "_parent", "_span", "_token", "_tracer")

    def __init__(
        self,
        tracer: trace.Tracer,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, AttributeValue],
        parent: Context | None,
    ) -> None:
        self._tracer, self._name, self._kind = tracer, name, kind
        self._attributes, self._parent = attributes, parent

    def __enter__(self) -> Span:
        self._span = self._tracer.start_span(
            self._name,
            context=self._parent,
            kind=self._kind,
            attributes=self._attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span, self._parent))
        return self._span

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)
        self._span.end()


def carries_trace_context(metadata: Metadata | None) -> bool:
    """Whether ``metadata`` holds a ``traceparent`` or ``tracestate`` entry."""
    for key, _ in metadata or ():
        if key in _CARRIED:
            return True
    return False


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """``traceparent`` (and ``tracestate``) of the current span, for a call to a peer."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return tuple(carrier.items())


def current_trace_id() -> str:
    """The current trace id as 32 hex digits; ``""`` outside any trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def mark_refused(span: Span, err: GatewayError) -> None:
    """Record a refusal or failure on ``span`` by its reason code (never its message)."""
    span.set_attribute("a2agw.reason", err.reason)
    span.set_status(Status(StatusCode.ERROR, err.reason))


def _otlp_exporter(settings: TracingSettings) -> SpanExporter:
    # Imported only when configured: the OTLP exporter pulls in its own protobufs.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    endpoint = settings.otlp_endpoint or ""
    inner = OTLPSpanExporter(
        endpoint=endpoint, insecure=settings.otlp_insecure, timeout=OTLP_TIMEOUT_SECONDS
    )
    return BackoffExporter(inner, endpoint)
