"""The services that open what compose wires: telemetry's exporters and the state stores.

They start before the agent is composed and stop after everything else: the
stores outlive every part that writes to them, and spans are flushed last.
"""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter

from gateway.config import AgentConfig
from gateway.storage import Stores, open_stores
from gateway.telemetry import Telemetry


class TelemetryService:
    """Metrics and spans: built at start (span exporters run threads), shut down at stop.

    Serving ``/metrics`` is a later service; its listener closes here, last of
    all, so ``/healthz`` and ``/readyz`` answer through the whole stop.
    """

    name = "telemetry"

    def __init__(
        self, config: AgentConfig, worker: int, span_exporter: SpanExporter | None = None
    ) -> None:
        """``span_exporter``: an extra exporter (tests' in-memory spans)."""
        self._config = config
        self._worker = worker
        self._span_exporter = span_exporter
        self._telemetry: Telemetry | None = None

    @property
    def telemetry(self) -> Telemetry:
        """The telemetry built at start."""
        if self._telemetry is None:
            raise RuntimeError("telemetry not started")
        return self._telemetry

    async def start(self) -> None:
        """Build the meters and tracers (metrics on worker 0 only)."""
        config = self._config
        self._telemetry = Telemetry(
            config.id,
            config.metrics if self._worker == 0 else None,
            config.tracing,
            span_exporter=self._span_exporter,
        )

    async def stop(self, grace: float) -> None:
        """Close /metrics if served, flush the spans, shut the providers down."""
        if self._telemetry is not None:
            await self._telemetry.stop()


class StateStores:
    """The state stores of ``config`` for one worker: opened at start, closed at stop."""

    name = "state stores"

    def __init__(self, config: AgentConfig, worker: int) -> None:
        self._config = config
        self._worker = worker
        self._stores: Stores | None = None

    @property
    def stores(self) -> Stores:
        """The stores opened at start."""
        if self._stores is None:
            raise RuntimeError("state stores not open")
        return self._stores

    async def start(self) -> None:
        """Open every store (files are created if missing).

        Raises:
            StateUnavailable: a store cannot be opened.
        """
        self._stores = open_stores(self._config, self._worker)

    async def stop(self, grace: float) -> None:
        """Close every store."""
        stores = self._stores
        if stores is None:
            return
        stores.idempotency.close()
        stores.replay.close()
        if stores.limit_table is not None:
            stores.limit_table.close()
        stores.plan_tasks.close()
        stores.a2a_tasks.close()
        if stores.push is not None:
            stores.push.close()
