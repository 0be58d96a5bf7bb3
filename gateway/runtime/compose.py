"""``compose``: wire one agent's parts from its config and inputs, with no I/O.

Nothing here opens a file or a socket, starts a thread or a task: the
servers are built when their services start (:mod:`gateway.runtime.listeners`),
the audit log opens its database when it starts, and the inputs were read
before (:mod:`gateway.runtime.inputs`). So a test may compose an agent and
start only the services it needs, and a failed start has only started
services to undo.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gateway.audit import AuditLog
from gateway.client.a2a.upstream_client import UpstreamClient
from gateway.client.mcp import McpUpstream
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, WorkloadApiTls
from gateway.console import ConsoleServer
from gateway.errors import AgentConfigError
from gateway.identity import TokenIdentities, token_identities
from gateway.identity.exchange import TokenExchange
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.limits.refusal_log import LimitRefusalLog
from gateway.outbound.router import Router
from gateway.outbound.upstream_capabilities import register_upstreams
from gateway.plans.document.checks import PlanLimits
from gateway.plans.execution.driver import PlanDriver
from gateway.plans.execution.executor import ExecutorParts
from gateway.plans.execution.planner import Planner, RerouteOrStop
from gateway.push.dispatcher import PushDispatcher
from gateway.push.notifier import PushNotifier
from gateway.push.resolver import Resolver, system_resolver
from gateway.push.sender import WebhookSender
from gateway.push.signature import NotificationSigner
from gateway.runtime.checkpoint_signing import checkpointer
from gateway.runtime.endpoints import Endpoints
from gateway.runtime.gauges import observe_parts
from gateway.runtime.inputs import Inputs
from gateway.runtime.listeners import GrpcServing, HttpsServing, McpServing
from gateway.runtime.parts import Parts
from gateway.runtime.peer_clients import PeerClients
from gateway.runtime.rotation import use_new_certificate
from gateway.runtime.status import AgentStatus
from gateway.server.a2a import A2AServicer
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.card import PublicCardCache
from gateway.server.a2a.card_signing import card_signer
from gateway.server.a2a.push_wire import ends_task, notification_body
from gateway.server.a2a_http import HttpEdge
from gateway.server.health import HealthMonitor
from gateway.storage import open_chain_writer


def compose(
    config: AgentConfig,
    inputs: Inputs,
    *,
    worker: int = 0,
    planner: Planner | None = None,
    plan_limits: PlanLimits | None = None,
    client_for: Callable[[str], PeerClient] | None = None,
    push_resolver: Resolver | None = None,
) -> Parts:
    """The parts of the agent ``config`` describes, wired over ``inputs``, none started.

    Args:
        config: The agent's config.
        inputs: Its certificate, policy, capabilities, telemetry and open stores.
        worker: This process's index when ``config.workers > 1`` (worker 0 alone
            signs audit checkpoints and serves the console).
        planner: Replans a failed plan step (default: reroute, else stop).
        plan_limits: Bounds on a plan's size and budget.
        client_for: The peer client the router uses (default: ``parts.clients.get``).
        push_resolver: Looks up webhook names (default: the system's resolver).

    Raises:
        AgentConfigError: an upstream's skill clashes with a served capability.
        ConfigError: the audit checkpoint settings or signing key are not usable.
    """
    tls, stores, telemetry = inputs.live_tls, inputs.stores, inputs.telemetry
    registry, policies = inputs.registry, inputs.policies
    upstreams = [UpstreamClient(entry, tls.current, config.tls) for entry in config.upstreams]
    register_upstreams(registry, upstreams)
    # Their tools are registered when they start (their schemas come from their tools/list).
    mcp_upstreams = [McpUpstream(entry, tls.current, config.tls) for entry in config.mcp_upstreams]
    telemetry.metrics.label_capabilities(cap.name for cap in registry)
    checkpoints = checkpointer(config, worker, tls.current)
    audit = AuditLog(
        open_chain_writer(config.audit_db, agent_id=config.id, sync=config.audit_sync),
        checkpoints=checkpoints,
        retry_seconds=config.audit_retry_seconds,
        observer=telemetry.metrics if telemetry.metrics.enabled else None,
    )
    clients = PeerClients(config, tls, telemetry.tracing)
    router = Router(
        registry=registry,
        policies=policies,
        peers=[peer.id for peer in config.peers],
        client_for=client_for or clients.get,
        exchange=_token_exchange(config),
    )
    handler = InvokeHandler(
        registry=registry,
        policies=policies,
        audit=audit,
        idempotency=stores.idempotency,
        bind_peer_call=router.bind,
        replay=stores.replay,
        limits=stores.limits,
        limit_refusals=LimitRefusalLog(audit),
        peer_issuer=tls.check_peer_issuer,
        tokens=_token_identities(config),
    )
    push = None
    if stores.push is not None:
        push = PushDispatcher(
            stores.push,
            PushNotifier(stores.push, config.push, audit, notification_body, ends_task),
            WebhookSender(config.push, push_resolver or system_resolver),
            NotificationSigner(config.id, lambda: tls.current),
            policies,
            audit,
            config.push,
            shared=stores.shared,
            retention=config.a2a.task_retention,
        )
    a2a_runs = BackgroundTasks(
        handler,
        stores.a2a_tasks,
        shared=stores.shared,
        retention=config.a2a.task_retention,
        notify=None if push is None else push.notifier.event,
    )
    if push is not None:
        push.notifier.runs_here = lambda task_id: a2a_runs.running(task_id) is not None
    endpoints = Endpoints(config, card_signer(config.id, lambda: tls.current))
    public_card = PublicCardCache(config.id, endpoints.card_issuer)
    a2a_servicer = A2AServicer(
        config.id,
        handler,
        stores.a2a_tasks,
        registry,
        endpoints.card_issuer,
        telemetry,
        default_capability=config.a2a.default_capability or "",
        runs=a2a_runs,
        push=None if push is None else push.notifier,
    )
    grpc = GrpcServing(config, handler, tls, a2a_servicer, telemetry, endpoints)
    https = None
    if config.a2a.http_listen is not None:
        edge = HttpEdge(
            handler,
            a2a_servicer,
            public_card.documents,
            v0_3_compat=config.a2a.v0_3_compat,
            stream_send_timeout=config.a2a.stream_send_timeout,
        )
        https = HttpsServing(config.a2a.http_listen, edge, tls, endpoints)
    mcp = McpServing(config, handler, registry, tls) if config.mcp is not None else None
    health = HealthMonitor(
        {
            "audit log": lambda: audit.healthy,
            "policy": policies.has_live_grant,
            "own certificate": tls.valid_now,
        },
        grpc.set_serving,
    )
    audit.add_health_listener(lambda _healthy: health.poke())
    status = AgentStatus(config, policies, tls, handler, health)
    telemetry.serve_health(status.health_state)
    observe_parts(telemetry.metrics, audit, policies, a2a_runs, tls, status)
    plans = PlanDriver(
        ExecutorParts(
            agent_id=config.id,
            router=router,
            store=stores.plan_tasks,
            planner=planner or RerouteOrStop(),
            limits=plan_limits or PlanLimits(),
            bind_peer_call=router.bind,
            approval_min_risk=config.plans.approval_min_risk,
            telemetry=telemetry,
            audit=audit,
        ),
        decisions=audit,
    )
    parts = Parts(
        config=config,
        worker=worker,
        telemetry=telemetry,
        live_tls=tls,
        workload_api=inputs.workload_api,
        policies=policies,
        registry=registry,
        stores=stores,
        upstreams=upstreams,
        mcp_upstreams=mcp_upstreams,
        checkpoints=checkpoints,
        audit=audit,
        clients=clients,
        router=router,
        handler=handler,
        a2a_runs=a2a_runs,
        endpoints=endpoints,
        public_card=public_card,
        grpc=grpc,
        https=https,
        mcp=mcp,
        health=health,
        status=status,
        console=ConsoleServer(config.console, status) if config.console and worker == 0 else None,
        plans=plans,
        push=push,
    )
    tls.on_change(lambda material: use_new_certificate(parts, material))
    return parts


def _token_identities(config: AgentConfig) -> TokenIdentities | None:
    """What verifies bearer tokens, with ``[identity.tokens]`` (None: off)."""
    tokens = config.identity.tokens
    if tokens is None:
        return None
    socket = config.tls.socket if isinstance(config.tls, WorkloadApiTls) else None
    return token_identities(tokens, config.id, socket)


def _token_exchange(config: AgentConfig) -> TokenExchange | None:
    """How calls onward carry the user they act for (None without ``[identity.tokens]``).

    The token endpoint is authenticated with the agent's certificate files; an
    agent whose certificate comes from the Workload API has none on disk, so
    it can only forward (``forward_user_tokens``), not exchange.
    """
    tokens = config.identity.tokens
    if tokens is None:
        return None
    tls = config.tls
    if isinstance(tls, WorkloadApiTls):
        if tokens.exchange_url is not None:
            raise AgentConfigError(
                "identity.tokens.exchange_url needs [tls] certificate files (the token "
                "endpoint is authenticated with them); the Workload API keeps none on disk"
            )
        return TokenExchange(tokens, _no_files)
    return TokenExchange(tokens, lambda: (tls.cert, tls.key))


def _no_files() -> tuple[Path, Path]:
    raise AssertionError("no exchange_url: the client certificate is never needed")
