"""The one place that decides each store's backend from a location or a config.

A location is a :class:`~pathlib.Path` (SQLite, the default, under
``state_dir``) or a :class:`~gateway.postgres.dsn.PostgresDsn` (shared by every
replica of an agent id; see docs/fleet.md). Implementations are imported where
they are chosen, so an agent on SQLite never loads the PostgreSQL driver, and
the modules that use these functions (``gateway.audit.query``, ...) may be
imported by the implementations without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gateway.errors import ConfigError
from gateway.postgres.dsn import PostgresDsn

if TYPE_CHECKING:
    from gateway.admin.idempotency.store import KeyAdmin
    from gateway.audit.follow import AuditFeed, FollowFilter
    from gateway.audit.store.store import AuditReader, ChainWriter
    from gateway.config import AgentConfig
    from gateway.inbound.idempotency.store import IdempotencyStore
    from gateway.inbound.limit_table import LimitTable
    from gateway.inbound.limits import CallLimiter
    from gateway.inbound.replay.store import ReplayWindow
    from gateway.plans.task_store.store import TaskStore
    from gateway.server.a2a.task_store.store import A2ATaskStore


@dataclass(frozen=True, slots=True)
class Stores:
    """The state stores of one agent process (the audit log is opened by
    :class:`~gateway.audit.log.AuditLog` through :func:`open_chain_writer`)."""

    idempotency: IdempotencyStore
    """Idempotency keys and the answers they stand for."""
    replay: ReplayWindow
    """Request ids seen recently (refuses a replayed call)."""
    limits: CallLimiter
    """Concurrent-call and rate limits of each grant."""
    limit_table: LimitTable | None
    """The mmap table behind ``limits`` when workers share it (flushed periodically)."""
    a2a_tasks: A2ATaskStore
    """A2A tasks and their history."""
    plan_tasks: TaskStore
    """Plan tasks, their steps and leases."""
    shared: bool
    """True when other processes (workers or replicas) use the same stores."""


def open_stores(config: AgentConfig, worker: int = 0) -> Stores:
    """Open every store of ``config`` for worker ``worker`` (files are created if missing).

    Raises:
        StateUnavailable: A store cannot be opened.
    """
    from gateway.inbound.idempotency.sqlite import SqliteIdempotencyStore
    from gateway.inbound.limit_table import LIMITS_FILE, LimitTable
    from gateway.inbound.limits import CallLimits
    from gateway.inbound.replay.mmap import REPLAY_FILE, ReplayTable
    from gateway.plans.task_store.sqlite import SqliteTaskStore
    from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore

    limit_table = None
    limits: CallLimiter = CallLimits(config.max_concurrent_calls)
    if config.workers > 1:  # a grant's limits hold across all workers
        limit_table = LimitTable(
            config.state_dir / LIMITS_FILE, worker, config.workers, config.max_concurrent_calls
        )
        limits = limit_table
    if isinstance(config.state_db, PostgresDsn):
        from gateway.inbound.idempotency.postgres import PostgresIdempotencyStore
        from gateway.inbound.replay.postgres import PostgresReplayWindow
        from gateway.plans.task_store.postgres import PostgresTaskStore
        from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore

        # Shared by every replica of this agent id (see docs/fleet.md).
        return Stores(
            idempotency=PostgresIdempotencyStore(config.state_db, config.id),
            replay=PostgresReplayWindow(config.state_db, config.id),
            limits=limits,
            limit_table=limit_table,
            a2a_tasks=PostgresA2ATaskStore(config.state_db, config.id),
            plan_tasks=PostgresTaskStore(config.state_db, config.id),
            shared=True,
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
        plan_tasks=SqliteTaskStore(config.state_dir / "tasks.sqlite"),
        shared=shared,
    )


def prepare_shared_files(config: AgentConfig) -> None:
    """Before any worker runs: earlier claims cut off, the replay window sized, limits anew.

    A PostgreSQL ``state_db`` needs none of the first two (each owner does it).
    """
    from gateway.inbound.limit_table import LIMITS_FILE, create_limit_file

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
        ConfigError: A DSN without an ``agent_id``.
    """
    if isinstance(where, PostgresDsn):
        from gateway.audit.store.postgres_append import PostgresChainWriter

        if not agent_id:
            raise ConfigError("an audit log in PostgreSQL needs the agent id of its chain")
        return PostgresChainWriter(where, agent_id)
    from gateway.audit.store.sqlite_append import SqliteChainWriter

    return SqliteChainWriter(where, busy_timeout_ms=busy_timeout_ms, synchronous=sync.upper())


def open_audit_reader(where: Path | PostgresDsn) -> AuditReader:
    """The reader of the audit store at ``where`` (opened per call, read-only)."""
    if isinstance(where, PostgresDsn):
        from gateway.audit.store.postgres_read import PostgresAuditReader

        return PostgresAuditReader(where)
    from gateway.audit.store.sqlite_read import SqliteAuditReader

    return SqliteAuditReader(where)


def open_key_admin(config: AgentConfig) -> KeyAdmin:
    """The operator's view of ``config``'s idempotency keys (audited through its log)."""
    if isinstance(config.state_db, PostgresDsn):
        from gateway.admin.idempotency.postgres import PostgresKeyAdmin

        return PostgresKeyAdmin(config.state_db, config.audit_db, config.id)
    from gateway.admin.idempotency.sqlite import SqliteKeyAdmin

    return SqliteKeyAdmin(config.idempotency_store, config.audit_db, config.id)


def open_audit_feed(
    where: Path | PostgresDsn,
    wanted: FollowFilter,
    *,
    since: timedelta | None = None,
    agent_id: str = "",
) -> AuditFeed:
    """The ``audit --follow`` feed of the store at ``where`` (see :mod:`gateway.audit.follow`).

    Raises:
        ConfigError: ``wanted.agent`` is given for a SQLite file (it holds one agent).
    """
    from gateway.audit.follow import PostgresAuditFeed, SqliteAuditFeed

    if isinstance(where, PostgresDsn):
        return PostgresAuditFeed(where, wanted, since=since)
    if wanted.agent is not None:
        raise ConfigError("--agent: a SQLite audit log holds one agent; give a PostgreSQL DSN")
    return SqliteAuditFeed(where, wanted, since=since, agent_id=agent_id)
