"""One agent: registry, policy, audit log, idempotency store, server, peer and upstream clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from datetime import timedelta
from pathlib import Path

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from gateway.audit import AuditLog, query_records
from gateway.audit.checkpoint import Checkpointer, CheckpointSigner
from gateway.config import AgentConfig
from gateway.errors import AgentConfigError, StateUnavailable
from gateway.inbound.idempotency import IdempotencyStore
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.pg_idempotency import PostgresIdempotencyStore
from gateway.inbound.pg_replay import PostgresReplayWindow
from gateway.inbound.replay import ReplayGuard, ReplayWindow
from gateway.outbound.router import Router
from gateway.outbound.upstream_capabilities import register_upstreams
from gateway.plans.checks import PlanLimits
from gateway.plans.executor import EventSink, ExecutorParts
from gateway.plans.model import Plan
from gateway.plans.pg_store import PostgresTaskStore
from gateway.plans.planner import Planner, RerouteOrStop
from gateway.plans.runner import TaskRunner
from gateway.plans.store import SqliteTaskStore, TaskStore
from gateway.plans.task import TaskResult
from gateway.postgres.dsn import PostgresDsn
from gateway.transport.a2a import A2AServicer, A2ATaskStore
from gateway.transport.a2a.upstream_client import UpstreamClient
from gateway.transport.client import PeerClient
from gateway.transport.server import GatewayServer
from gateway.transport.tls import TlsMaterial
from policies.store import PolicyStore

_log = logging.getLogger(__name__)

# Refusals that happen after the replay check, so their request ids count as used.
_REMEMBERED_REFUSALS = frozenset({"INVALID_INPUT", "DEADLINE_EXCEEDED"})
_PURGE_EVERY_SECONDS = 3600.0
_HEALTH_EVERY_SECONDS = 0.5


class Agent:
    """A running peer. Use ``async with Agent(config) as agent`` or start()/stop()."""

    def __init__(
        self,
        config: AgentConfig,
        registry: CapabilityRegistry | None = None,
        *,
        planner: Planner | None = None,
        plan_limits: PlanLimits | None = None,
    ) -> None:
        self.config = config
        self.tls = TlsMaterial.from_files(config.tls.ca, config.tls.cert, config.tls.key)
        if self.tls.spiffe_id() != config.id:
            raise AgentConfigError(
                f"agent id {config.id} does not match its certificate ({self.tls.spiffe_id()})"
            )
        self.policies = PolicyStore(config.policy)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.registry = registry if registry is not None else CapabilityRegistry()
        if registry is None:
            try:
                load_capability_modules(
                    config.modules, self.registry, AgentEnvironment(config.id, config.state_dir)
                )
            except CapabilityModuleError as err:
                raise AgentConfigError(str(err)) from err
        self.upstreams = [UpstreamClient(entry, self.tls, config.tls) for entry in config.upstreams]
        """One reused a2a-sdk client per ``[[upstreams]]`` entry (closed by stop())."""
        register_upstreams(self.registry, self.upstreams)
        self.audit = AuditLog(
            config.audit_db,
            agent_id=config.id,
            sync=config.audit_sync,
            checkpoints=self._checkpointer(),
        )
        self.idempotency: IdempotencyStore
        self.replay: ReplayWindow
        if isinstance(config.state_db, PostgresDsn):
            # Shared by every replica of this agent id (see README "Beyond one machine").
            self.idempotency = PostgresIdempotencyStore(config.state_db, config.id)
            self.replay = PostgresReplayWindow(config.state_db, config.id)
        else:
            self.idempotency = IdempotencyStore(config.idempotency_store)
            self.replay = ReplayGuard()
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
        )
        self.a2a_tasks = A2ATaskStore(config.state_dir / "a2a-tasks.sqlite")
        self._server = GatewayServer(
            config.id,
            self.handler,
            self.tls,
            A2AServicer(
                config.id, self.handler, self.a2a_tasks, self.registry, lambda: self.address
            ),
        )
        self.task_store: TaskStore = (
            PostgresTaskStore(config.state_db, config.id)
            if isinstance(config.state_db, PostgresDsn)
            else SqliteTaskStore(config.state_dir / "tasks.sqlite")
        )
        self.plans = TaskRunner(
            ExecutorParts(
                agent_id=config.id,
                router=self.router,
                store=self.task_store,
                planner=planner or RerouteOrStop(),
                limits=plan_limits or PlanLimits(),
                bind_peer_call=self.router.bind,
            )
        )
        self._watcher: asyncio.Task[None] | None = None
        self._purger: asyncio.Task[None] | None = None
        self._health_reporter: asyncio.Task[None] | None = None
        self.port = 0

    def _checkpointer(self) -> Checkpointer | None:
        settings = self.config.audit_checkpoints
        if not settings.enabled:
            return None
        return Checkpointer(
            CheckpointSigner(self.config.id, self.tls.key_pem, self.tls.cert_pem),
            self.config.checkpoint_file,
            every_records=settings.every_records,
            every_seconds=settings.every_seconds,
        )

    @property
    def address(self) -> str:
        """``host:port`` the agent serves on (after start)."""
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def start(self, *, watch_policy: bool = True) -> int:
        """Open the audit log, start serving; returns the bound port."""
        await self.audit.start()
        await asyncio.to_thread(self._remember_recent_request_ids)
        await self._purge_idempotency_keys()
        self.port = await self._server.start(self.config.listen)
        if watch_policy:
            self._watcher = asyncio.create_task(self.policies.watch())
        self._purger = asyncio.create_task(self._purge_periodically())
        self._health_reporter = asyncio.create_task(self._report_health())
        return self.port

    async def _report_health(self) -> None:
        # Health follows the audit log both ways: a database that went away makes the
        # agent NOT_SERVING (it refuses all work), and SERVING again once it reconnects.
        serving = True
        while True:
            await asyncio.sleep(_HEALTH_EVERY_SECONDS)
            if self.audit.healthy != serving:
                serving = self.audit.healthy
                await self._server.set_serving(serving)

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
        # that got past the policy (the ones ReplayGuard records) from the log.
        if self.replay.shared:
            return  # the window outlives the process in the shared table
        window = self.replay.window_seconds
        now_ms = time.time() * 1000
        records = query_records(
            self.config.audit_db,
            agent=self.config.id,
            since=timedelta(seconds=window),
            limit=self.replay.max_entries,
        )
        self.replay.preload(
            (r.peer_id, r.request_id, (now_ms - r.time_unix_ms) / 1000)
            for r in records
            if r.decision == "allow" or r.reason in _REMEMBERED_REFUSALS
        )

    async def run(self, plan: Plan, *, on_event: EventSink | None = None) -> TaskResult:
        """Run ``plan`` as a new task (see ``self.plans`` for start/resume/cancel)."""
        if on_event is None:
            return await self.plans.run(plan)
        return await self.plans.run(plan, on_event=on_event)

    async def stop(self, grace: float = 2.0) -> None:
        """Graceful shutdown: stop serving, close clients, flush the audit log.

        Running tasks are interrupted, not ended: they stay resumable.
        """
        await self.plans.shutdown()
        for task in (self._watcher, self._purger, self._health_reporter):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._server.stop(grace)
        await self.a2a_tasks.flush()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        for upstream in self.upstreams:
            await upstream.close()
        await self.audit.close()
        self.idempotency.close()
        self.replay.close()
        self.task_store.close()
        self.a2a_tasks.close()

    def client(self, peer_id: str, address: str | None = None) -> PeerClient:
        """A reused mTLS client for ``peer_id`` (address from config unless given)."""
        client = self._clients.get(peer_id)
        if client is None:
            target = address or self.config.peer(peer_id).address
            client = PeerClient(peer_id, target, self.tls)
            self._clients[peer_id] = client
        return client

    def install_reload_signal(self) -> None:
        """Reload the policy on SIGHUP (in addition to watching the file)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.policies.reload)

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def default_state_paths(base: Path, name: str) -> tuple[Path, Path]:
    """Conventional audit DB and state dir for an agent called ``name`` under ``base``."""
    return base / f"{name}-audit.sqlite", base / f"{name}-state"
