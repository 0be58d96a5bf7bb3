"""What an agent says about itself now: for the console, ``/readyz`` and the gauges."""

from __future__ import annotations

from gateway.config import AgentConfig
from gateway.inbound.in_flight import InFlightCalls
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.limits.admission import LimitStats
from gateway.server.health import HealthMonitor
from gateway.telemetry.health_http import HealthState
from gateway.transport.live_tls import LiveTls, TlsStats
from policies.store import PolicyStore


class AgentStatus:
    """Read-only snapshots of one agent (a ``ConsoleSource``), and its serving phase.

    Attributes:
        config: The agent's config.
        policies: The policy in force.
        started: Health is published (set by the health service when it starts).
        stopping: Shutdown has begun (set by the health service when it stops; final).
    """

    def __init__(
        self,
        config: AgentConfig,
        policies: PolicyStore,
        tls: LiveTls,
        handler: InvokeHandler,
        health: HealthMonitor,
    ) -> None:
        self.config = config
        self.policies = policies
        self._tls = tls
        self._handler = handler
        self._health = health
        self.started = False
        self.stopping = False

    def tls_stats(self) -> TlsStats:
        """Certificate reloads ok/rejected and the own certificate's expiry."""
        return self._tls.stats()

    def limit_stats(self) -> LimitStats:
        """Limit refusals per peer and reason, and calls in flight."""
        return self._handler.limits.stats()

    def calls_in_flight(self) -> InFlightCalls:
        """The calls running now, one row each, and the clock their times are on."""
        registry = self._handler.in_flight
        return InFlightCalls(registry.snapshot(), registry.now())

    def health_state(self) -> HealthState:
        """What the gRPC health service says now, and why (for ``/readyz``)."""
        return HealthState(
            started=self.started, stopping=self.stopping, failing=self._health.failing
        )
