"""One agent: registry, policy, audit log, idempotency store, server, peer and upstream clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from gateway.audit import AuditLog
from gateway.audit.checkpoint import Checkpointer, CheckpointSigner
from gateway.audit.signer_archive import remember_signer, signers_file
from gateway.client.a2a.upstream_client import UpstreamClient
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, WorkloadApiTls
from gateway.console import ConsoleServer
from gateway.errors import AgentConfigError, AuditUnavailable, StateUnavailable, reasons_where
from gateway.inbound.idempotency.store import IdempotencyStore
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.limits.admission import AdmissionControl, LimitStats, limit_refusal_counts
from gateway.inbound.limits.refusal_log import DEFAULT_INTERVAL_SECONDS, LimitRefusalLog
from gateway.inbound.limits.shared_table import LimitTable
from gateway.inbound.replay.store import ReplayWindow
from gateway.local.private_files import private_dir
from gateway.outbound.router import Router
from gateway.outbound.upstream_capabilities import register_upstreams
from gateway.plans.document.checks import PlanLimits
from gateway.plans.document.model import Plan
from gateway.plans.execution.driver import PlanDriver
from gateway.plans.execution.executor import ExecutorParts
from gateway.plans.execution.planner import Planner, RerouteOrStop
from gateway.plans.execution.step_events import EventSink
from gateway.plans.task import TaskResult
from gateway.plans.task_store.store import TaskStore
from gateway.server.a2a import A2AServicer
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.card import CardIssuer, PublicCardCache
from gateway.server.a2a.card_signing import card_signer
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH, A2AHttpServer, HttpEdge
from gateway.server.a2a_http.protocol import ConnectionBudget
from gateway.server.grpc_server import GatewayServer
from gateway.server.health import HealthMonitor
from gateway.storage import open_audit_reader, open_chain_writer, open_stores
from gateway.telemetry import Telemetry
from gateway.telemetry.health_http import HealthState
from gateway.telemetry.sdk_logs import withhold_a2a_sdk_text
from gateway.transport.live_tls import LiveTls, TlsStats
from gateway.transport.tls import TlsMaterial
from gateway.transport.workload_api import WorkloadApiFeed
from policies.store import PolicyStore

_log = logging.getLogger(__name__)

_PURGE_EVERY_SECONDS = 3600.0
_RETIRE_GRACE_SECONDS = 60.0  # calls on a channel retired by a rotation get this long


class Agent:
    """A running peer. Use ``async with Agent(config) as agent`` or start()/stop()."""

    def __init__(
        self,
        config: AgentConfig,
        registry: CapabilityRegistry | None = None,
        *,
        planner: Planner | None = None,
        plan_limits: PlanLimits | None = None,
        span_exporter: SpanExporter | None = None,
        worker: int = 0,
    ) -> None:
        """Compose the agent; ``worker`` is this process's index when ``config.workers > 1``.

        Worker 0 alone serves the metrics endpoint and writes audit checkpoints
        (see :mod:`gateway.runtime.supervisor`).
        """
        self.config = config
        self.worker = worker
        self.telemetry = Telemetry(
            config.id,
            config.metrics if worker == 0 else None,
            config.tracing,
            span_exporter=span_exporter,
        )
        """Metrics, spans and the /metrics endpoint (``span_exporter``: tests' spans)."""
        self._workload_api: WorkloadApiFeed | None = None
        if isinstance(config.tls, WorkloadApiTls):  # the first SVID, or no start at all
            self._workload_api = WorkloadApiFeed(config.id, config.tls)
        self.live_tls = LiveTls(
            config.id, config.tls, self._workload_api.first if self._workload_api else None
        )
        """Certificate, key and CA in force; re-read on SIGHUP and when the files change,
        or updated by every push of the Workload API."""
        self.live_tls.on_change(self._use_new_certificate)
        self.policies = PolicyStore(config.policy)
        private_dir(config.state_dir)
        self.registry = registry if registry is not None else CapabilityRegistry()
        if registry is None:
            try:
                load_capability_modules(
                    config.modules,
                    self.registry,
                    AgentEnvironment(config.id, config.state_dir),
                    config.module_dir,
                )
            except CapabilityModuleError as err:
                raise AgentConfigError(str(err)) from err
        self.upstreams = [UpstreamClient(entry, self.tls, config.tls) for entry in config.upstreams]
        """One reused a2a-sdk client per ``[[upstreams]]`` entry (closed by stop())."""
        register_upstreams(self.registry, self.upstreams)
        self.telemetry.metrics.label_capabilities(cap.name for cap in self.registry)
        self._checkpoints = self._checkpointer()
        self.audit = AuditLog(
            open_chain_writer(config.audit_db, agent_id=config.id, sync=config.audit_sync),
            checkpoints=self._checkpoints,
            retry_seconds=config.audit_retry_seconds,
            observer=self.telemetry.metrics if self.telemetry.metrics.enabled else None,
        )
        stores = open_stores(config, worker)
        self.idempotency: IdempotencyStore = stores.idempotency
        self.replay: ReplayWindow = stores.replay
        self._limit_table: LimitTable | None = stores.limit_table
        limits: AdmissionControl = stores.limits
        self._clients: dict[str, PeerClient] = {}
        self.router = Router(
            registry=self.registry,
            policies=self.policies,
            peers=[peer.id for peer in config.peers],
            client_for=self.client,
        )
        self.handler = InvokeHandler(
            registry=self.registry,
            policies=self.policies,
            audit=self.audit,
            idempotency=self.idempotency,
            bind_peer_call=self.router.bind,
            replay=self.replay,
            limits=limits,
            limit_refusals=LimitRefusalLog(self.audit),
            peer_issuer=self.live_tls.check_peer_issuer,
        )
        self.a2a_tasks = stores.a2a_tasks
        self.a2a_runs = BackgroundTasks(
            self.handler,
            self.a2a_tasks,
            shared=stores.shared,
            retention=config.a2a.task_retention,
        )
        """A2A tasks running in the background here (return_immediately, streams)."""
        self._sign_card = card_signer(config.id, lambda: self.tls)
        self.public_card = PublicCardCache(config.id, self.card_issuer)
        """The signed public card (no skills) served at /.well-known/agent-card.json."""
        a2a_servicer = A2AServicer(
            config.id,
            self.handler,
            self.a2a_tasks,
            self.registry,
            self.card_issuer,
            self.telemetry,
            default_capability=config.a2a.default_capability or "",
            runs=self.a2a_runs,
        )
        self._server = GatewayServer(
            config.id,
            self.handler,
            self.live_tls,
            a2a_servicer,
            self.telemetry,
            reuse_port=config.workers > 1,
        )
        self._https: A2AHttpServer | None = None
        self._edge = HttpEdge(
            self.handler,
            a2a_servicer,
            self.public_card.get,
            v0_3_compat=config.a2a.v0_3_compat,
            stream_send_timeout=config.a2a.stream_send_timeout,
        )
        """The A2A HTTP bindings: same servicer, handler and audit as gRPC (served if so set)."""
        self.health = HealthMonitor(
            {
                "audit log": lambda: self.audit.healthy,
                "policy": self.policies.has_live_grant,
                "own certificate": self.live_tls.valid_now,
            },
            self._server.set_serving,
        )
        """Keeps the gRPC health status true (see gateway.server.health)."""
        self.audit.add_health_listener(lambda _healthy: self.health.poke())
        self._health_published = self._stopping = False
        self.telemetry.serve_health(self.health_state)
        self.console = (
            ConsoleServer(config.console, self) if config.console and worker == 0 else None
        )
        """The read-only operator console (``[console]``; the first worker only)."""
        self._observe_components()
        self.task_store: TaskStore = stores.plan_tasks
        self.plans = PlanDriver(
            ExecutorParts(
                agent_id=config.id,
                router=self.router,
                store=self.task_store,
                planner=planner or RerouteOrStop(),
                limits=plan_limits or PlanLimits(),
                bind_peer_call=self.router.bind,
                approval_min_risk=config.plans.approval_min_risk,
                telemetry=self.telemetry,
                audit=self.audit,
            ),
            decisions=self.audit,
        )
        self._watcher: asyncio.Task[None] | None = None
        self._purger: asyncio.Task[None] | None = None
        self._limit_flusher: asyncio.Task[None] | None = None
        self._tls_watcher: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def tls(self) -> TlsMaterial:
        """The TLS material in force (it changes when the certificate rotates)."""
        return self.live_tls.current

    def tls_stats(self) -> TlsStats:
        """Certificate reloads ok/rejected and the own certificate's expiry (snapshot)."""
        return self.live_tls.stats()

    def _use_new_certificate(self, material: TlsMaterial) -> None:
        # New peer channels are built lazily with the new client certificate;
        # the old ones close once their calls in flight have had time to end.
        self.public_card.invalidate()  # re-signed with the new key when next asked for
        if self._https is not None:  # new HTTPS handshakes present the new certificate
            self._https.use_tls(material)
        if self._checkpoints is not None:  # a rotated-away key signs nothing more
            self._checkpoints.use_signer(self._signer(material))
        retired, self._clients = list(self._clients.values()), {}
        for client in retired:
            self._retire(client.close(_RETIRE_GRACE_SECONDS))
        for upstream in self.upstreams:
            link = upstream.use_tls(material)
            if link is not None:
                self._retire(_close_later(link.aclose, _RETIRE_GRACE_SECONDS))

    def _retire(self, closing: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(closing)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _checkpointer(self) -> Checkpointer | None:
        settings = self.config.audit_checkpoints
        if not settings.enabled or self.worker != 0:  # one checkpoint writer per chain
            return None
        return Checkpointer(
            self._signer(self.tls),
            self.config.checkpoint_file,
            every_records=settings.every_records,
            every_seconds=settings.every_seconds,
        )

    def _signer(self, material: TlsMaterial) -> CheckpointSigner:
        if isinstance(self.config.tls, WorkloadApiTls):
            # Nobody else keeps a short-lived SVID: audit verify finds it here.
            path = signers_file(self.config.checkpoint_file)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                remember_signer(path, material.cert_pem)
            except OSError as err:
                _log.error(
                    "cannot keep the checkpoint signer's certificate in %s (%s): "
                    "audit verify needs it given with --cert",
                    path,
                    err.strerror,
                )
        return CheckpointSigner(self.config.id, material.key_pem, material.cert_pem)

    def _observe_components(self) -> None:
        """Pull gauges over the components' own counts (one line each)."""
        metrics, audit, policies = self.telemetry.metrics, self.audit, self.policies
        metrics.observe_gauge(
            "a2agw_audit_queue_depth",
            "Audit records queued, not yet committed",
            lambda: audit.queue_depth,
        )
        metrics.observe_gauge(
            "a2agw_a2a_tasks_running",
            "A2A tasks running in the background in this process (return_immediately, streams)",
            lambda: len(self.a2a_runs),
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
            lambda: self.tls.not_after().timestamp(),
            unit="s",
        )
        metrics.observe_counter(
            "a2agw_limit_refusals",
            "Calls refused by per-peer limits or the server-wide cap, by reason",
            lambda: limit_refusal_counts(self.limit_stats(), by_peer=metrics.peer_labels),
        )
        metrics.observe_counter(
            "a2agw_certificate_reloads",
            "Certificate reloads by result (a rejected set leaves the old one in force)",
            lambda: [
                ({"result": "ok"}, self.tls_stats().reloads_ok),
                ({"result": "rejected"}, self.tls_stats().reloads_rejected),
            ],
        )
        metrics.observe_gauge(
            "a2agw_certificate_expiring_soon",
            "1 while the agent's own certificate expires within [tls] expiry_warning",
            lambda: float(self.tls_stats().expiring_soon),
        )

    @property
    def address(self) -> str:
        """``host:port`` the agent serves on (after start)."""
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @property
    def https_url(self) -> str:
        """``https://HOST:PORT`` of the A2A HTTP bindings ("" when not served)."""
        if self._https is None or not self._https.port:
            return ""
        host = self._https.host
        return f"https://{f'[{host}]' if ':' in host else host}:{self._https.port}"

    @property
    def https_connections(self) -> ConnectionBudget | None:
        """The HTTPS server's connections: open now, of which anonymous, and its bounds
        (None when the HTTP bindings are not served)."""
        return None if self._https is None else self._https.budget

    def card_issuer(self) -> CardIssuer:
        """The interfaces the agent serves and its card signer, for the A2A cards."""
        base = self.config.a2a.http_url or self.https_url
        return CardIssuer(
            self.config.a2a.grpc_address or self.address,
            jsonrpc_url=f"{base}{JSONRPC_PATH}" if base else "",
            rest_url=f"{base}{REST_PATH}" if base else "",
            v0_3=self.config.a2a.v0_3_compat,
            sign=self._sign_card,
        )

    async def start(self, *, watch_policy: bool = True, watch_tls: bool | None = None) -> int:
        """Open the audit log, start serving; returns the bound port.

        ``watch_policy`` / ``watch_tls`` (default: as ``watch_policy``) poll the
        policy file / the certificate files and reload them on change.
        """
        withhold_a2a_sdk_text()
        self.live_tls.warn_if_expiring()
        await self.telemetry.start()
        await self.audit.start()
        await asyncio.to_thread(self._remember_recent_request_ids)
        await self._purge_idempotency_keys()
        await self.a2a_runs.recover()
        self.a2a_runs.start_upkeep()
        self.port = await self._server.start(self.config.listen)
        _log.info("serving on port %d", self.port)
        if self._workload_api is not None:
            self._workload_api.start(self.live_tls)
        if self.config.a2a.http_listen is not None:
            self._https = A2AHttpServer(self._edge.app(), self.tls)
            await self._https.start(self.config.a2a.http_listen)
        self.public_card.invalidate()  # the ports are known now
        self.health.start()
        self._health_published = True
        if self.console is not None:
            await self.console.start()
        if watch_policy:
            self._watcher = asyncio.create_task(self.policies.watch())
        if watch_policy if watch_tls is None else watch_tls:
            self._tls_watcher = asyncio.create_task(self.live_tls.watch())
        self._purger = asyncio.create_task(self._purge_periodically())
        self._limit_flusher = asyncio.create_task(self._flush_limit_refusals())
        return self.port

    async def _flush_limit_refusals(self) -> None:
        while True:
            await asyncio.sleep(DEFAULT_INTERVAL_SECONDS)
            try:
                self.handler.limit_refusals.flush_expired()
            except AuditUnavailable as err:  # the counts stay pending; the next round retries
                _log.warning("aggregated limit refusals not written yet: %s", err.message)

    def health_state(self) -> HealthState:
        """What the gRPC health service says now, and why (for ``/readyz``)."""
        return HealthState(
            started=self._health_published,
            stopping=self._stopping,
            failing=self.health.failing,
        )

    def limit_stats(self) -> LimitStats:
        """Limit refusals per peer and reason, and calls in flight (read-only snapshot)."""
        return self.handler.limits.stats()

    async def _purge_idempotency_keys(self) -> None:
        retention = self.config.idempotency_retention
        purged = await self.idempotency.purge_completed(retention)
        if purged:
            _log.info("purged %d completed idempotency key(s) older than %s", purged, retention)

    async def _purge_periodically(self) -> None:
        while True:
            await asyncio.sleep(_PURGE_EVERY_SECONDS)
            try:
                await self._purge_idempotency_keys()
            except StateUnavailable as err:  # the next round tries again; calls are unaffected
                _log.warning("idempotency purge failed: %s", err.message)

    def _remember_recent_request_ids(self) -> None:
        # A restart must not reopen the replay window: reload the ids of calls
        # that got past the policy (the ones the window records) from the log.
        if self.replay.shared:
            return  # the window outlives the process in the shared table
        window = self.replay.window_seconds
        now_ms = time.time() * 1000
        recent = open_audit_reader(self.config.audit_db).recent_request_ids(
            agent=self.config.id,
            since=timedelta(seconds=window),
            limit=self.replay.max_entries,
            refusals=reasons_where("spends_request_id"),
        )
        self.replay.preload(
            (peer_id, request_id, (now_ms - time_unix_ms) / 1000)
            for peer_id, request_id, time_unix_ms in recent
        )

    async def run(self, plan: Plan, *, on_event: EventSink | None = None) -> TaskResult:
        """Run ``plan`` as a new task (see ``self.plans`` for start/resume/cancel)."""
        if on_event is None:
            return await self.plans.run(plan)
        return await self.plans.run(plan, on_event=on_event)

    async def stop(self, grace: float = 2.0) -> None:
        """Graceful shutdown: stop serving, close clients, flush the audit log.

        Running tasks are interrupted, not ended: they stay resumable. Running
        A2A tasks end ``FAILED`` (``TASK_INTERRUPTED``), and their streams with
        them. Health
        says NOT_SERVING from the first moment of shutdown.
        """
        self._stopping = True
        await self.health.stop()
        if self.console is not None:
            await self.console.stop()
        await self._server.enter_shutdown()
        await self.plans.shutdown()
        await self.a2a_runs.shutdown()  # ends their streams and subscriptions too
        for task in (self._watcher, self._purger, self._limit_flusher, self._tls_watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._https is not None:
            await self._https.stop(grace)
        await self._server.stop(grace)
        # The server has cancelled the calls still running; their outcome
        # records are queued as they unwind, before the audit log closes.
        await self.handler.wait_running(grace)
        if self._workload_api is not None:
            await self._workload_api.stop()
        try:  # counted refusals reach the log before it closes
            self.handler.limit_refusals.flush_all()
        except AuditUnavailable as err:
            _log.error("could not write aggregated limit refusals: %s", err.message)
        await self.a2a_tasks.flush()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        for closing in list(self._retiring):  # channels retired by a rotation: close now
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing
        for upstream in self.upstreams:
            await upstream.close()
        await self.audit.close()
        self.idempotency.close()
        self.replay.close()
        if self._limit_table is not None:
            self._limit_table.close()
        self.task_store.close()
        self.a2a_tasks.close()
        await self.telemetry.stop()

    def client(self, peer_id: str, address: str | None = None) -> PeerClient:
        """A reused mTLS client for ``peer_id`` (address from config unless given)."""
        client = self._clients.get(peer_id)
        if client is None:
            target = address or self.config.peer(peer_id).address
            client = PeerClient(peer_id, target, self.tls, self.telemetry.tracing)
            self._clients[peer_id] = client
        return client

    def install_reload_signal(self) -> None:
        """Reload the policy and the certificate files on SIGHUP (besides watching them)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)

    def reload(self) -> None:
        """Re-read the policy and the certificate files (what SIGHUP does)."""
        self.policies.reload()
        self.live_tls.reload()

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _close_later(close: Callable[[], Awaitable[None]], grace: float) -> None:
    """Close after ``grace`` seconds (or at once if cancelled: the agent is stopping)."""
    try:
        await asyncio.sleep(grace)
    finally:
        await close()


def default_state_paths(base: Path, name: str) -> tuple[Path, Path]:
    """Conventional audit DB and state dir for an agent called ``name`` under ``base``."""
    return base / f"{name}-audit.sqlite", base / f"{name}-state"
