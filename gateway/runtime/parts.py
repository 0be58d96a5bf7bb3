"""The components of one agent, as :func:`~gateway.runtime.compose.compose` wires them."""

from __future__ import annotations

from dataclasses import dataclass

from capabilities.registry import CapabilityRegistry
from gateway.audit import AuditLog
from gateway.audit.checkpoint import Checkpointer
from gateway.client.a2a.upstream_client import UpstreamClient
from gateway.client.mcp import McpUpstream
from gateway.config import AgentConfig
from gateway.console import ConsoleServer
from gateway.inbound.idempotency.store import IdempotencyStore
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.replay.store import ReplayWindow
from gateway.outbound.router import Router
from gateway.plans.execution.driver import PlanDriver
from gateway.plans.store.store import PlanTaskStore
from gateway.push.dispatcher import PushDispatcher
from gateway.runtime.endpoints import Endpoints
from gateway.runtime.listeners import GrpcServing, HttpsServing, McpServing
from gateway.runtime.peer_clients import PeerClients
from gateway.runtime.status import AgentStatus
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.card import PublicCardCache
from gateway.server.a2a.task_store.store import A2ATaskStore
from gateway.server.health import HealthMonitor
from gateway.storage import Stores
from gateway.telemetry import Telemetry
from gateway.transport.live_tls import LiveTls
from gateway.transport.workload_api import WorkloadApiFeed
from policies.store import PolicyStore


@dataclass(frozen=True, slots=True)
class Parts:
    """Every component of one agent; :mod:`gateway.runtime.services` starts and stops them."""

    config: AgentConfig
    """The agent's config."""
    worker: int
    """This process's index among ``config.workers`` (0: serves metrics, signs checkpoints)."""
    telemetry: Telemetry
    """Metrics, spans and the /metrics endpoint."""
    live_tls: LiveTls
    """Certificate, key and CA in force; re-read on SIGHUP and when the files change,
    or updated by every push of the Workload API."""
    workload_api: WorkloadApiFeed | None
    """The Workload API stream of new SVIDs (``[tls] workload_api``)."""
    policies: PolicyStore
    """The policy in force, reloaded when its file changes."""
    registry: CapabilityRegistry
    """The capabilities served here, upstream ones included."""
    stores: Stores
    """The state stores (idempotency, replay, limits, A2A and plan tasks)."""
    upstreams: list[UpstreamClient]
    """One reused a2a-sdk client per ``[[upstreams]]`` entry."""
    mcp_upstreams: list[McpUpstream]
    """One connection per ``[[mcp_upstreams]]`` entry; its tools are registered at start."""
    checkpoints: Checkpointer | None
    """The signed audit checkpoints (worker 0, when enabled)."""
    audit: AuditLog
    """The hash-chained audit log."""
    clients: PeerClients
    """The mTLS clients of the peers."""
    router: Router
    """Routes outbound calls and plan steps to peers."""
    handler: InvokeHandler
    """Decides, runs and audits every inbound call, whatever its binding."""
    a2a_runs: BackgroundTasks
    """A2A tasks running in the background here (return_immediately, streams)."""
    endpoints: Endpoints
    """The bound ports and the card that names them."""
    public_card: PublicCardCache
    """The signed public card (no skills) served at /.well-known/agent-card.json."""
    grpc: GrpcServing
    """The gRPC server (PeerGateway, A2A, health)."""
    https: HttpsServing | None
    """The A2A HTTP bindings (``[a2a] http_listen``): same servicer, handler and audit."""
    mcp: McpServing | None
    """The capabilities as MCP tools (``[mcp] listen``): same handler and audit."""
    health: HealthMonitor
    """Keeps the gRPC health status true (see gateway.server.health)."""
    status: AgentStatus
    """What the agent says about itself (console, /readyz)."""
    console: ConsoleServer | None
    """The read-only operator console (``[console]``; the first worker only)."""
    plans: PlanDriver
    """Runs, resumes and cancels plan tasks."""
    push: PushDispatcher | None = None
    """A2A push notifications: the config methods' side and the delivery worker
    (``[push] enabled``; None when off)."""

    @property
    def idempotency(self) -> IdempotencyStore:
        """Idempotency keys and the answers they stand for."""
        return self.stores.idempotency

    @property
    def replay(self) -> ReplayWindow:
        """Request ids seen recently."""
        return self.stores.replay

    @property
    def a2a_tasks(self) -> A2ATaskStore:
        """A2A tasks and their history."""
        return self.stores.a2a_tasks

    @property
    def plan_tasks(self) -> PlanTaskStore:
        """Plan tasks, their steps and leases."""
        return self.stores.plan_tasks
