"""What an agent reports about itself: OpenTelemetry metrics and traces, JSON logs.

Wire a component's own counts into metrics with one line (see
:meth:`AgentMetrics.observe_gauge` and :meth:`AgentMetrics.observe_counter`).
"""

from gateway.telemetry.agent_telemetry import Telemetry
from gateway.telemetry.metrics import AgentMetrics, Reading
from gateway.telemetry.tracing import AgentTracing, current_trace_id, outgoing_metadata

__all__ = [
    "AgentMetrics",
    "AgentTracing",
    "Reading",
    "Telemetry",
    "current_trace_id",
    "outgoing_metadata",
]
