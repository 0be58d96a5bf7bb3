"""One agent: its parts composed from its config, its services started and stopped in order.

``Agent(config)`` reads and opens nothing. :meth:`Agent.start` reads the
inputs (certificate, policy, capability modules), opens the resources
(telemetry, state stores), composes the parts (:func:`~gateway.runtime.compose.compose`,
no I/O) and starts the services (:func:`~gateway.runtime.services.agent_services`)
on one :class:`~gateway.runtime.service_stack.ServiceStack`: a start that
fails at any step stops what it had started, in reverse, and raises its
error. :meth:`Agent.stop` stops everything in reverse.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter

from capabilities.registry import CapabilityRegistry
from gateway.audit import AuditLog
from gateway.client.a2a.upstream_client import UpstreamClient
from gateway.client.mcp import McpUpstream
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig
from gateway.console import ConsoleServer
from gateway.errors import Unauthenticated
from gateway.identity.exchange import ActingFor
from gateway.inbound.idempotency.store import IdempotencyStore
from gateway.inbound.in_flight import InFlightCalls
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.limits.admission import LimitStats
from gateway.inbound.replay.store import ReplayWindow
from gateway.outbound.router import Router
from gateway.plans.document.checks import PlanLimits
from gateway.plans.document.model import Plan
from gateway.plans.execution.driver import PlanDriver
from gateway.plans.execution.planner import Planner
from gateway.plans.execution.step_events import EventSink
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import PlanTaskResult
from gateway.push.resolver import Resolver
from gateway.runtime.compose import compose
from gateway.runtime.inputs import Inputs, load_capabilities, read_identity
from gateway.runtime.parts import Parts
from gateway.runtime.resources import StateStores, TelemetryService
from gateway.runtime.service_stack import ServiceStack
from gateway.runtime.services import agent_services
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.card import CardIssuer, PublicCardCache
from gateway.server.a2a.task_store.store import A2ATaskStore
from gateway.server.a2a_http.protocol import ConnectionBudget
from gateway.server.health import HealthMonitor
from gateway.telemetry import Telemetry
from gateway.telemetry.health_http import HealthState
from gateway.telemetry.sdk_logs import withhold_a2a_sdk_text
from gateway.transport.live_tls import LiveTls, TlsStats
from gateway.transport.tls import TlsMaterial
from policies.store import PolicyStore

_log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 2.0
"""How long calls in flight may take at a stop (and when a failed start unwinds)."""


class Agent:
    """A peer. Use ``async with Agent(config) as agent`` or start()/stop().

    Its components are :attr:`parts` (after start); the attributes below are
    the ones callers use most, read from there.
    """

    def __init__(
        self,
        config: AgentConfig,
        registry: CapabilityRegistry | None = None,
        *,
        planner: Planner | None = None,
        plan_limits: PlanLimits | None = None,
        span_exporter: SpanExporter | None = None,
        worker: int = 0,
        push_resolver: Resolver | None = None,
    ) -> None:
        """Remember what to compose; nothing is read, opened or started yet.

        Args:
            config: The agent's config.
            registry: The capabilities to serve (default: ``config.modules`` loaded at start).
            planner: Replans a failed plan step.
            plan_limits: Bounds on a plan's size and budget.
            span_exporter: An extra span exporter (tests' in-memory spans).
            worker: This process's index when ``config.workers > 1``; worker 0
                alone serves the metrics endpoint and writes audit checkpoints
                (see :mod:`gateway.runtime.supervisor`).
            push_resolver: Looks up webhook names (default: the system's resolver;
                tests pass their own).
        """
        self.config = config
        self._push_resolver = push_resolver
        self.worker = worker
        self._registry = registry
        self._planner = planner
        self._plan_limits = plan_limits
        self._span_exporter = span_exporter
        self._parts: Parts | None = None
        self._services = ServiceStack(unwind_grace=DEFAULT_GRACE_SECONDS)

    async def start(self, *, watch_policy: bool = True, watch_tls: bool | None = None) -> int:
        """Compose the agent and start serving; returns the bound gRPC port.

        ``watch_policy`` / ``watch_tls`` (default: as ``watch_policy``) poll the
        policy file / the certificate files and reload them on change.

        Raises:
            GatewayError: a step failed (``AgentConfigError`` for the config or its
                files, ``AddressUnavailable`` for a taken port, ...); what had
                started is stopped again first.
        """
        withhold_a2a_sdk_text()
        async with self._services.starting():
            parts = await self._compose()
            parts.live_tls.warn_if_expiring()
            watch_tls = watch_policy if watch_tls is None else watch_tls
            services = agent_services(parts, watch_policy=watch_policy, watch_tls=watch_tls)
            await self._services.enter_all(services)
        _log.info("serving on port %d", self.port)
        return self.port

    async def open(self) -> None:
        """Compose the agent without serving: for commands that use its parts directly.

        The inputs are read and the stores opened, but no service starts (the
        caller starts what it needs, e.g. the audit log); :meth:`stop` then
        stops the parts as it stops a served agent.
        """
        async with self._services.starting():
            parts = await self._compose()
            for service in agent_services(parts):
                self._services.adopt(service)

    async def _compose(self) -> Parts:
        config = self.config
        # Read before anything is opened: a bad certificate or policy touches no file.
        live_tls, workload_api = read_identity(config)
        policies = PolicyStore(config.policy)
        telemetry = TelemetryService(config, self.worker, self._span_exporter)
        await self._services.enter(telemetry)
        registry = load_capabilities(config, self._registry)
        stores = StateStores(config, self.worker)
        await self._services.enter(stores)
        inputs = Inputs(
            live_tls, workload_api, policies, registry, telemetry.telemetry, stores.stores
        )
        self._parts = compose(
            config,
            inputs,
            worker=self.worker,
            planner=self._planner,
            plan_limits=self._plan_limits,
            client_for=self.client,  # a subclass may wrap the clients the router uses
            push_resolver=self._push_resolver,
        )
        return self._parts

    async def stop(self, grace: float = DEFAULT_GRACE_SECONDS) -> None:
        """Graceful shutdown: stop serving, close clients, flush the audit log.

        Everything started is stopped in reverse (see :mod:`gateway.runtime.services`
        for the order and what it guarantees). Running tasks are interrupted,
        not ended: they stay resumable. Running A2A tasks end ``FAILED``
        (``TASK_INTERRUPTED``), and their streams with them. Health says
        NOT_SERVING from the first moment of shutdown. Nothing happens if
        nothing was started.
        """
        await self._services.stop(grace)

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def parts(self) -> Parts:
        """The agent's components (after :meth:`start` or :meth:`open`)."""
        if self._parts is None:
            raise RuntimeError(f"agent {self.config.id} is not started: it has no parts yet")
        return self._parts

    @property
    def port(self) -> int:
        """The gRPC port (0 before start)."""
        return 0 if self._parts is None else self._parts.endpoints.grpc_port

    @property
    def address(self) -> str:
        """``host:port`` the agent serves on (after start)."""
        if self._parts is None:
            return f"{self.config.listen.rsplit(':', 1)[0]}:0"
        return self._parts.endpoints.address

    @property
    def https_url(self) -> str:
        """``https://HOST:PORT`` of the A2A HTTP bindings ("" when not served)."""
        return "" if self._parts is None else self._parts.endpoints.https_url

    @property
    def https_connections(self) -> ConnectionBudget | None:
        """The HTTPS server's connections: open now, of which anonymous, and its bounds
        (None when the HTTP bindings are not served)."""
        https = None if self._parts is None else self._parts.https
        return None if https is None else https.budget

    @property
    def mcp_url(self) -> str:
        """``https://HOST:PORT/mcp`` of the MCP endpoint ("" when not served)."""
        mcp = None if self._parts is None else self._parts.mcp
        return "" if mcp is None else mcp.url

    def card_issuer(self) -> CardIssuer:
        """The interfaces the agent serves and its card signer, for the A2A cards."""
        return self.parts.endpoints.card_issuer()

    def client(self, peer_id: str, address: str | None = None) -> PeerClient:
        """A reused mTLS client for ``peer_id`` (address from config unless given)."""
        return self.parts.clients.get(peer_id, address)

    async def acting_for(self, user_token: str) -> ActingFor:
        """A user this agent may act for: ``user_token`` verified as a user token of a
        trusted issuer (``[identity.tokens]``) issued to this agent (``azp`` or ``act.sub``).

        For ``self.plans.start(plan, acting_for=...)``: every step the task sends
        to a peer then carries a token for that user made for that peer.

        Raises:
            Unauthenticated: tokens are off here, or the token is refused (its reason).
        """
        tokens = self.handler.pipeline.tokens
        if tokens is None:
            raise Unauthenticated("this agent takes no tokens ([identity.tokens] is off)")
        return ActingFor(await tokens.user_of(user_token, self.config.id), user_token)

    async def run(self, plan: Plan, *, on_event: EventSink | None = None) -> PlanTaskResult:
        """Run ``plan`` as a new task (see ``self.plans`` for start/resume/cancel)."""
        if on_event is None:
            return await self.plans.run(plan)
        return await self.plans.run(plan, on_event=on_event)

    def install_reload_signal(self) -> None:
        """Reload the policy and the certificate files on SIGHUP (besides watching them)."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)

    def reload(self) -> None:
        """Re-read the policy and the certificate files (what SIGHUP does)."""
        self.policies.reload()
        self.live_tls.reload()

    def health_state(self) -> HealthState:
        """What the gRPC health service says now, and why (for ``/readyz``)."""
        return self.parts.status.health_state()

    def limit_stats(self) -> LimitStats:
        """Limit refusals per peer and reason, and calls in flight (read-only snapshot)."""
        return self.parts.status.limit_stats()

    def calls_in_flight(self) -> InFlightCalls:
        """The calls running now, one row each (read-only snapshot)."""
        return self.parts.status.calls_in_flight()

    def tls_stats(self) -> TlsStats:
        """Certificate reloads ok/rejected and the own certificate's expiry (snapshot)."""
        return self.parts.status.tls_stats()

    @property
    def tls(self) -> TlsMaterial:
        """The TLS material in force (it changes when the certificate rotates)."""
        return self.parts.live_tls.current

    @property
    def live_tls(self) -> LiveTls:
        """Certificate, key and CA in force, reloaded on change."""
        return self.parts.live_tls

    @property
    def telemetry(self) -> Telemetry:
        """Metrics, spans and the /metrics endpoint."""
        return self.parts.telemetry

    @property
    def registry(self) -> CapabilityRegistry:
        """The capabilities served here."""
        return self.parts.registry

    @property
    def policies(self) -> PolicyStore:
        """The policy in force."""
        return self.parts.policies

    @property
    def audit(self) -> AuditLog:
        """The audit log."""
        return self.parts.audit

    @property
    def handler(self) -> InvokeHandler:
        """Decides, runs and audits every inbound call."""
        return self.parts.handler

    @property
    def router(self) -> Router:
        """Routes outbound calls and plan steps."""
        return self.parts.router

    @property
    def plans(self) -> PlanDriver:
        """Runs, resumes and cancels plan tasks."""
        return self.parts.plans

    @property
    def plan_tasks(self) -> PlanTaskStore:
        """Plan tasks, their steps and leases."""
        return self.parts.plan_tasks

    @property
    def a2a_tasks(self) -> A2ATaskStore:
        """A2A tasks and their history."""
        return self.parts.a2a_tasks

    @property
    def a2a_runs(self) -> BackgroundTasks:
        """A2A tasks running in the background here (return_immediately, streams)."""
        return self.parts.a2a_runs

    @property
    def idempotency(self) -> IdempotencyStore:
        """Idempotency keys and the answers they stand for."""
        return self.parts.idempotency

    @property
    def replay(self) -> ReplayWindow:
        """Request ids seen recently."""
        return self.parts.replay

    @property
    def public_card(self) -> PublicCardCache:
        """The signed public card (no skills) served at /.well-known/agent-card.json."""
        return self.parts.public_card

    @property
    def health(self) -> HealthMonitor:
        """Keeps the gRPC health status true."""
        return self.parts.health

    @property
    def console(self) -> ConsoleServer | None:
        """The read-only operator console (``[console]``; the first worker only)."""
        return self.parts.console

    @property
    def mcp_upstreams(self) -> list[McpUpstream]:
        """One connection per ``[[mcp_upstreams]]`` entry (their tools pinned at start)."""
        return self.parts.mcp_upstreams

    @property
    def upstreams(self) -> list[UpstreamClient]:
        """One reused a2a-sdk client per ``[[upstreams]]`` entry."""
        return self.parts.upstreams


def default_state_paths(base: Path, name: str) -> tuple[Path, Path]:
    """Conventional audit DB and state dir for an agent called ``name`` under ``base``."""
    return base / f"{name}-audit.sqlite", base / f"{name}-state"
