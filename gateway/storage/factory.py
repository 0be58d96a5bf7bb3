"""The one place that decides each store's backend from a location or a config.

A location is a :class:`~pathlib.Path` (SQLite, the default, under
``state_dir``) or a :class:`~gateway.postgres.dsn.PostgresDsn` (shared by every
replica of an agent id; see docs/fleet.md). Implementations are imported where
they are chosen, so an agent on SQLite never loads the PostgreSQL driver, and
the stores themselves never import this module: their callers (the agent,
the CLI, the console, the benchmarks) open a store here and pass it in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gateway.errors import ConfigError
from gateway.inbound.idempotency.operator import AuditTarget, KeyAdmin
from gateway.postgres.dsn import PostgresDsn, StoreLocation, parse_location

if TYPE_CHECKING:
    from gateway.audit.filter import AuditFilter
    from gateway.audit.follow import AuditFeed
    from gateway.audit.store.store import AuditReader, ChainWriter
    from gateway.config import AgentConfig
    from gateway.inbound.idempotency.store import IdempotencyStore
    from gateway.inbound.limits.admission import AdmissionControl
    from gateway.inbound.limits.shared_table import LimitTable
    from gateway.inbound.replay.store import ReplayWindow
    from gateway.plans.store.store import PlanTaskStore
    from gateway.postgres.source import ConnectionSource
    from gateway.push.store.store import PushStore
    from gateway.server.a2a.task_store.store import A2ATaskStore


@dataclass(frozen=True, slots=True)
class Stores:
    """The state stores of one agent process (the audit log is an
    :class:`~gateway.audit.log.AuditLog` over :func:`open_chain_writer`)."""

    idempotency: IdempotencyStore
    """Idempotency keys and the answers they stand for."""
    replay: ReplayWindow
    """Request ids seen recently (refuses a replayed call)."""
    limits: AdmissionControl
    """Concurrent-call and rate limits of each grant."""
    limit_table: LimitTable | None
    """The mmap table behind ``limits`` when workers share it (flushed periodically)."""
    a2a_tasks: A2ATaskStore
    """A2A tasks and their history."""
    plan_tasks: PlanTaskStore
    """Plan tasks, their steps and leases."""
    shared: bool
    """True when other processes (workers or replicas) use the same stores."""
    push: PushStore | None = None
    """A2A push configs and the notification outbox (None: ``[push]`` is not enabled)."""


def open_stores(config: AgentConfig, worker: int = 0) -> Stores:
    """Open every store of ``config`` for worker ``worker`` (files are created if missing).

    Raises:
        StateUnavailable: A store cannot be opened.
    """
    from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore
    from gateway.inbound.limits.admission import PeerCallLimits
    from gateway.inbound.limits.shared_table import LIMITS_FILE, LimitTable
    from gateway.inbound.replay.mmap import REPLAY_FILE, ReplayTable
    from gateway.plans.store.sqlite import SqlitePlanTaskStore
    from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore

    limit_table = None
    limits: AdmissionControl = PeerCallLimits(config.max_concurrent_calls)
    if config.workers > 1:  # a grant's limits hold across all workers
        limit_table = LimitTable(
            config.state_dir / LIMITS_FILE, worker, config.workers, config.max_concurrent_calls
        )
        limits = limit_table
    if isinstance(config.state_db, PostgresDsn):
        from gateway.inbound.idempotency.postgres import PostgresIdempotencyStore
        from gateway.inbound.replay.postgres import PostgresReplayWindow
        from gateway.plans.store.postgres import PostgresPlanTaskStore
        from gateway.postgres.pool import StatePool
        from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore

        # Shared by every replica of this agent id (see docs/fleet.md); one
        # pool per store, so a busy store cannot starve another of connections.
        database = connection_source(config.state_db)
        return Stores(
            idempotency=PostgresIdempotencyStore(
                StatePool(database, "idempotency store"), config.id
            ),
            replay=PostgresReplayWindow(StatePool(database, "replay window"), config.id),
            limits=limits,
            limit_table=limit_table,
            a2a_tasks=PostgresA2ATaskStore(StatePool(database, "A2A task store"), config.id),
            plan_tasks=PostgresPlanTaskStore(StatePool(database, "task store"), config.id),
            shared=True,
            push=_postgres_push_store(database, config.id) if config.push.enabled else None,
        )
    shared = config.workers > 1  # sibling processes share the files
    return Stores(
        idempotency=SqliteIdempotencyStore(config.idempotency_store, shared=shared),
        replay=ReplayTable(
            config.state_dir / REPLAY_FILE if shared else None,
            capacity=config.replay_window_ids,
        ),
        limits=limits,
        limit_table=limit_table,
        a2a_tasks=SqliteA2ATaskStore(config.state_dir / "a2a-tasks.sqlite"),
        plan_tasks=SqlitePlanTaskStore(config.state_dir / "tasks.sqlite"),
        shared=shared,
        push=_sqlite_push_store(config.state_dir / "push.sqlite") if config.push.enabled else None,
    )


def _sqlite_push_store(path: Path) -> PushStore:
    from gateway.push.store.sqlite import SqlitePushStore

    return SqlitePushStore(path)


def _postgres_push_store(database: ConnectionSource, agent_id: str) -> PushStore:
    from gateway.postgres.pool import StatePool
    from gateway.push.store.postgres import PostgresPushStore

    return PostgresPushStore(StatePool(database, "push store"), agent_id)


def prepare_shared_files(config: AgentConfig) -> None:
    """Before any worker runs: earlier claims cut off, the replay window sized, limits anew.

    A PostgreSQL ``state_db`` needs none of the first two (each owner does it).
    """
    from gateway.inbound.limits.shared_table import LIMITS_FILE, create_limit_file

    if not isinstance(config.state_db, PostgresDsn):
        from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore
        from gateway.inbound.replay.mmap import REPLAY_FILE, size_replay_file

        SqliteIdempotencyStore(config.idempotency_store).close()
        size_replay_file(config.state_dir / REPLAY_FILE, config.replay_window_ids)
    create_limit_file(config.state_dir / LIMITS_FILE, config.workers)


def open_chain_writer(
    where: Path | PostgresDsn,
    *,
    agent_id: str = "",
    busy_timeout_ms: int = 5000,
    sync: Literal["full", "normal"] = "full",
) -> ChainWriter:
    """The writer of one audit chain (not opened yet).

    Args:
        where: The SQLite file, or a PostgreSQL DSN.
        agent_id: The agent whose chain this is (required with a DSN: the
            table is shared by agents, one chain each).
        busy_timeout_ms: SQLite: how long a commit waits for another connection's lock.
        sync: SQLite ``synchronous`` level (see :class:`~gateway.audit.log.AuditLog`).

    Raises:
        ConfigError: A DSN without an ``agent_id``, or ``busy_timeout_ms`` < 0.
    """
    if busy_timeout_ms < 0:
        raise ConfigError(f"audit busy_timeout_ms must be >= 0, not {busy_timeout_ms}")
    if isinstance(where, PostgresDsn):
        from gateway.audit.store.postgres import PostgresChainWriter

        if not agent_id:
            raise ConfigError("an audit log in PostgreSQL needs the agent id of its chain")
        return PostgresChainWriter(connection_source(where), agent_id)
    from gateway.audit.store.sqlite import SqliteChainWriter

    return SqliteChainWriter(where, busy_timeout_ms=busy_timeout_ms, synchronous=sync.upper())


def open_audit_reader(where: Path | PostgresDsn) -> AuditReader:
    """The reader of the audit store at ``where`` (opened per call, read-only)."""
    if isinstance(where, PostgresDsn):
        from gateway.audit.store.postgres import PostgresAuditReader

        return PostgresAuditReader(connection_source(where))
    from gateway.audit.store.sqlite import SqliteAuditReader

    return SqliteAuditReader(where)


def open_key_admin(config: AgentConfig) -> KeyAdmin:
    """The operator's view of ``config``'s idempotency keys (audited through its log)."""
    if isinstance(config.state_db, PostgresDsn):
        from gateway.inbound.idempotency.postgres import PostgresKeyAdmin

        return PostgresKeyAdmin(
            connection_source(config.state_db), audit_target(config.audit_db), config.id
        )
    from gateway.inbound.idempotency.sqlite import SqliteKeyAdmin

    return SqliteKeyAdmin(config.idempotency_store, audit_target(config.audit_db), config.id)


def audit_target(where: StoreLocation) -> AuditTarget:
    """Where an operator's action on an idempotency key is recorded: the log at ``where``."""

    def open_writer(agent_id: str) -> ChainWriter:
        return open_chain_writer(where, agent_id=agent_id, busy_timeout_ms=5000)

    return AuditTarget(where, open_writer)


def open_audit_feed(
    where: Path | PostgresDsn,
    wanted: AuditFilter,
    *,
    agent_id: str = "",
    after_seq: int | None = None,
) -> AuditFeed:
    """The ``audit --follow`` feed of the store at ``where`` (see :mod:`gateway.audit.follow`).

    Args:
        where: The SQLite file, or a PostgreSQL DSN.
        wanted: Which records (``since``: start that far back; no ``limit``).
        agent_id: The agent of a SQLite file's one chain (named in each record).
        after_seq: Start after this record (of ``wanted.agent``'s chain in PostgreSQL).

    Raises:
        ConfigError: The store cannot be opened, ``wanted.agent`` is given for a
            SQLite file (it holds one agent), or ``wanted.limit`` is given.
    """
    from gateway.audit.follow import PostgresAuditFeed, SqliteAuditFeed

    if isinstance(where, PostgresDsn):
        return PostgresAuditFeed(connection_source(where), wanted, after_seq=after_seq)
    if wanted.agent is not None:
        raise ConfigError("--agent: a SQLite audit log holds one agent; give a PostgreSQL DSN")
    return SqliteAuditFeed(where, wanted, agent_id=agent_id, after_seq=after_seq)


def location(text: str) -> StoreLocation:
    """The store a setting's text names: a PostgreSQL database for a
    ``postgresql://`` URL, else a SQLite file (as a config file reads it)."""
    parsed = parse_location(text)
    return parsed if isinstance(parsed, PostgresDsn) else Path(text)


def connection_source(where: StoreLocation) -> ConnectionSource:
    """The connection source of the PostgreSQL database at ``where``.

    Raises:
        ConfigError: ``where`` is a SQLite file, not a PostgreSQL database.
    """
    from gateway.postgres.source import ConnectionSource

    if not isinstance(where, PostgresDsn):
        raise ConfigError(f"{where}: not a PostgreSQL database (postgresql://...)")
    return ConnectionSource(where)
