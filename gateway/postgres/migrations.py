"""Versioned schema migrations for the shared PostgreSQL database.

Every process applies the pending ones at start (under an advisory lock, so
replicas starting together apply each once) and refuses to run against a
schema newer than it knows: an older gateway must not write rows a newer one
reads differently.

The audit table's record columns are written here as data (name and SQL
type), not read from ``AuditRecord``: a released migration must create the
same table whatever the record class looks like later, and this module stays
below the audit package (which uses it). A new record field needs one line
here, ``Migration(n, ..., add_record_column("name", "TEXT"), ("name",))``;
``gateway.audit.store.postgres.audit_columns_covered`` (checked by a test) says
whether the migrations create every record field with its type.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import psycopg

from gateway.errors import ConfigError

_LOCK_KEY = 0x61326167  # "a2ag": one advisory lock for migrations
SqlType = Literal["BIGINT", "DOUBLE PRECISION", "TEXT"]
"""The SQL type of an audit record column (an int, a float, else text)."""


def record_column_ddl(name: str, sql_type: SqlType) -> str:
    """``name TYPE NOT NULL`` for an audit record column."""
    return f"{name} {sql_type} NOT NULL"


def add_record_column(name: str, sql_type: SqlType) -> tuple[str, ...]:
    """The statement adding a new audit record column (old rows get the type's zero)."""
    default = "''" if sql_type == "TEXT" else "0"
    return (
        f"ALTER TABLE audit_records ADD COLUMN {record_column_ddl(name, sql_type)} "
        f"DEFAULT {default}",
    )


_V1_RECORD_COLUMNS: tuple[tuple[str, SqlType], ...] = (
    ("seq", "BIGINT"),
    ("time_unix_ms", "BIGINT"),
    ("request_id", "TEXT"),
    ("task_id", "TEXT"),
    ("step_id", "TEXT"),
    ("peer_id", "TEXT"),
    ("capability", "TEXT"),
    ("version_constraint", "TEXT"),
    ("served_version", "TEXT"),
    ("decision", "TEXT"),
    ("reason", "TEXT"),
    ("detail", "TEXT"),
    ("payload_size", "BIGINT"),
    ("payload_sha256", "TEXT"),
    ("latency_ms", "DOUBLE PRECISION"),
)

_V1 = (
    "CREATE TABLE audit_records (agent_id TEXT NOT NULL, "
    + ", ".join(record_column_ddl(name, sql_type) for name, sql_type in _V1_RECORD_COLUMNS)
    + ", prev_hash TEXT NOT NULL, record_hash TEXT NOT NULL, "
    "CHECK (decision IN ('allow', 'refuse')), PRIMARY KEY (agent_id, seq))",
    "CREATE INDEX audit_records_time ON audit_records (time_unix_ms)",
    "CREATE TABLE audit_heads (agent_id TEXT PRIMARY KEY, count BIGINT NOT NULL, "
    "last_hash TEXT NOT NULL)",
    "CREATE TABLE idempotency (agent_id TEXT NOT NULL, peer TEXT NOT NULL, "
    "capability TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL, "
    "state TEXT NOT NULL, served_version TEXT NOT NULL DEFAULT '', payload BYTEA, "
    "evidence_sha256 TEXT NOT NULL DEFAULT '', claim_id TEXT NOT NULL DEFAULT '', "
    "claim_owner TEXT NOT NULL DEFAULT '', updated_unix_ms BIGINT NOT NULL, "
    "PRIMARY KEY (agent_id, peer, capability, key))",
    "CREATE TABLE replay_window (agent_id TEXT NOT NULL, peer TEXT NOT NULL, "
    "request_id TEXT NOT NULL, seen_unix_ms BIGINT NOT NULL, "
    "PRIMARY KEY (agent_id, peer, request_id))",
    "CREATE INDEX replay_window_seen ON replay_window (seen_unix_ms)",
    "CREATE TABLE tasks (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "plan_json TEXT NOT NULL, state TEXT NOT NULL, revision INTEGER NOT NULL, "
    "reason TEXT NOT NULL, message TEXT NOT NULL, steps_used INTEGER NOT NULL, "
    "peer_calls INTEGER NOT NULL, elapsed DOUBLE PRECISION NOT NULL, "
    "created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL, PRIMARY KEY (agent_id, task_id))",
    "CREATE TABLE task_steps (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "step_id TEXT NOT NULL, revision INTEGER NOT NULL, status TEXT NOT NULL, "
    "where_ TEXT NOT NULL, attempts INTEGER NOT NULL, duration_ms DOUBLE PRECISION NOT NULL, "
    "output_json TEXT, served_version TEXT, time_ms BIGINT, sha256 TEXT, "
    "replayed INTEGER NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL, "
    "notes_json TEXT NOT NULL, PRIMARY KEY (agent_id, task_id, step_id))",
    "CREATE TABLE task_revisions (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "revision INTEGER NOT NULL, reason TEXT NOT NULL, time_ms BIGINT NOT NULL, "
    "plan_json TEXT NOT NULL, PRIMARY KEY (agent_id, task_id, revision))",
    "CREATE TABLE task_write_pins (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "step_id TEXT NOT NULL, revision INTEGER NOT NULL, where_ TEXT NOT NULL, "
    "idempotency_key TEXT NOT NULL, version TEXT NOT NULL, time_ms BIGINT NOT NULL, "
    "PRIMARY KEY (agent_id, task_id, step_id, revision))",
    "CREATE TABLE task_leases (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "owner TEXT NOT NULL, expires_ms BIGINT NOT NULL, PRIMARY KEY (agent_id, task_id))",
)


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: its number, what it does, and its statements."""

    version: int
    description: str
    statements: tuple[str, ...]
    adds_record_columns: tuple[tuple[str, SqlType], ...] = ()
    """The audit record columns the statements create (name, SQL type)."""


_V2 = (
    *add_record_column("trace_id", "TEXT"),
    "ALTER TABLE tasks ADD COLUMN tool_calls INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE task_steps ADD COLUMN confidence TEXT NOT NULL DEFAULT 'unverified'",
    "ALTER TABLE task_steps ADD COLUMN sources_json TEXT NOT NULL DEFAULT '[]'",
    "ALTER TABLE task_steps ADD COLUMN candidates_json TEXT NOT NULL DEFAULT '[]'",
    "ALTER TABLE task_steps ADD COLUMN asked_verification INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE task_approvals (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "step_id TEXT NOT NULL, capability TEXT NOT NULL, where_ TEXT NOT NULL, "
    "version TEXT NOT NULL, risk TEXT NOT NULL, input_sha256 TEXT NOT NULL, "
    "fields_json TEXT NOT NULL, decision TEXT NOT NULL, decided_by TEXT NOT NULL, "
    "time_ms BIGINT NOT NULL, PRIMARY KEY (agent_id, task_id, step_id))",
)

_V3 = (
    "CREATE TABLE a2a_tasks (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "seq BIGINT GENERATED ALWAYS AS IDENTITY, owner TEXT NOT NULL, context_id TEXT NOT NULL, "
    "state TEXT NOT NULL, capability TEXT NOT NULL, served_version TEXT NOT NULL, "
    "output BYTEA NOT NULL, evidence_sha256 TEXT NOT NULL, replayed BOOLEAN NOT NULL, "
    "reason TEXT NOT NULL, message TEXT NOT NULL, created_ms BIGINT NOT NULL, "
    "updated_ms BIGINT NOT NULL, CHECK (state IN ('completed', 'failed')), "
    "PRIMARY KEY (agent_id, task_id))",
    "CREATE INDEX a2a_tasks_owner ON a2a_tasks (agent_id, owner, seq)",
)

_V4 = (
    "CREATE TABLE task_failed_attempts (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "step_id TEXT NOT NULL, where_ TEXT NOT NULL, input_sha256 TEXT NOT NULL, "
    "PRIMARY KEY (agent_id, task_id, step_id, where_, input_sha256))",
)

_V5 = (
    "ALTER TABLE task_steps ADD COLUMN may_have_written INTEGER NOT NULL DEFAULT 0",
    # Before this, the flag was read back from the note a failed write carried.
    "UPDATE task_steps SET may_have_written = 1 WHERE notes_json LIKE "
    "'%: the write may have run there and its outcome is unknown, "
    "so it is not sent to another peer\"%'",
)

_V6 = (
    "ALTER TABLE a2a_tasks DROP CONSTRAINT IF EXISTS a2a_tasks_state_check",
    "ALTER TABLE a2a_tasks ADD CONSTRAINT a2a_tasks_state_check CHECK "
    "(state IN ('completed', 'failed', 'canceled', 'submitted', 'working'))",
    "ALTER TABLE a2a_tasks ADD COLUMN runner TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE a2a_tasks ADD COLUMN lease_ms BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE a2a_tasks ADD COLUMN cancel_by TEXT NOT NULL DEFAULT ''",
    "CREATE INDEX a2a_tasks_unfinished ON a2a_tasks (agent_id, lease_ms) "
    "WHERE state IN ('submitted', 'working')",
)

_V7 = (
    "CREATE TABLE a2a_task_chunks (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "owner TEXT NOT NULL, n INTEGER NOT NULL, chunk BYTEA NOT NULL, "
    "PRIMARY KEY (agent_id, task_id, n))",
)

_V8 = (
    *add_record_column("on_behalf_of", "TEXT"),
    *add_record_column("actor_chain", "TEXT"),
)

_V9 = (
    "CREATE TABLE push_configs (agent_id TEXT NOT NULL, seq BIGINT GENERATED ALWAYS AS IDENTITY, "
    "task_id TEXT NOT NULL, config_id TEXT NOT NULL, owner TEXT NOT NULL, url TEXT NOT NULL, "
    "token TEXT NOT NULL, auth_scheme TEXT NOT NULL, auth_credentials TEXT NOT NULL, "
    "created_ms BIGINT NOT NULL, PRIMARY KEY (agent_id, task_id, config_id))",
    "CREATE INDEX push_configs_seq ON push_configs (agent_id, seq)",
    "CREATE TABLE push_outbox (agent_id TEXT NOT NULL, "
    "seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, owner TEXT NOT NULL, "
    "task_id TEXT NOT NULL, config_id TEXT NOT NULL, notification_id TEXT NOT NULL, "
    "body BYTEA NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_ms BIGINT NOT NULL, "
    "lease_ms BIGINT NOT NULL DEFAULT 0, created_ms BIGINT NOT NULL)",
    "CREATE INDEX push_outbox_config ON push_outbox (agent_id, task_id, config_id, seq)",
    "CREATE INDEX push_outbox_due ON push_outbox (agent_id, next_ms)",
)

_OPEN_STATES = "('submitted', 'working', 'input-required', 'auth-required')"
_V10 = (
    "ALTER TABLE a2a_tasks DROP CONSTRAINT IF EXISTS a2a_tasks_state_check",
    "ALTER TABLE a2a_tasks ADD CONSTRAINT a2a_tasks_state_check CHECK (state IN "
    "('completed', 'failed', 'canceled', 'submitted', 'working', 'input-required', "
    "'auth-required'))",
    "ALTER TABLE a2a_tasks ADD COLUMN status_json BYTEA NOT NULL DEFAULT ''::bytea",
    "ALTER TABLE a2a_tasks ADD COLUMN history BYTEA NOT NULL DEFAULT ''::bytea",
    "ALTER TABLE a2a_tasks ADD COLUMN asked_schema TEXT NOT NULL DEFAULT ''",
    "CREATE TABLE a2a_task_inputs (agent_id TEXT NOT NULL, task_id TEXT NOT NULL, "
    "owner TEXT NOT NULL, message_id TEXT NOT NULL, state TEXT NOT NULL, "
    "input BYTEA NOT NULL, parts BYTEA NOT NULL, created_ms BIGINT NOT NULL, "
    "PRIMARY KEY (agent_id, task_id, message_id))",
    "DROP INDEX IF EXISTS a2a_tasks_unfinished",
    f"CREATE INDEX a2a_tasks_open ON a2a_tasks (agent_id, lease_ms) WHERE state IN {_OPEN_STATES}",
)

_V11 = (
    "ALTER TABLE tasks ADD COLUMN on_behalf_of TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE tasks ADD COLUMN user_issuer TEXT NOT NULL DEFAULT ''",
)

_V12 = (
    # The rows already there were started before users were kept: no user.
    "ALTER TABLE a2a_tasks ADD COLUMN on_behalf_of TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE a2a_tasks ADD COLUMN user_issuer TEXT NOT NULL DEFAULT ''",
    # A row an older replica still running inserts names no user it may have had:
    # an issuer no verified user has, so no caller finds it (fail closed).
    "ALTER TABLE a2a_tasks ALTER COLUMN user_issuer SET DEFAULT '?'",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "audit, idempotency, replay window, tasks", _V1, _V1_RECORD_COLUMNS),
    Migration(
        2,
        "audit trace ids; plan tool calls, verified results and approvals",
        _V2,
        (("trace_id", "TEXT"),),
    ),
    Migration(3, "A2A tasks shared by the replicas of an agent id", _V3),
    Migration(4, "failed plan attempts (digests), remembered across restarts", _V4),
    Migration(5, "a failed plan step's 'may have written' as a column of its own", _V5),
    Migration(6, "A2A background tasks: unfinished states, runner, lease, cancel requests", _V6),
    Migration(7, "output chunks of running A2A tasks, for followers in other processes", _V7),
    Migration(
        8,
        "audit: the user a call acted for and its actor chain",
        _V8,
        (("on_behalf_of", "TEXT"), ("actor_chain", "TEXT")),
    ),
    Migration(9, "A2A push notifications: webhook configs and the delivery outbox", _V9),
    Migration(
        10,
        "A2A conversations: waiting states, status messages with parts, history, answers left "
        "for the process running a task",
        _V10,
    ),
    Migration(11, "plan tasks: the user a task acts for (subject and issuer)", _V11),
    Migration(12, "A2A tasks: the user a task was started for (subject and issuer)", _V12),
)
"""Every schema version in order; append, never edit a released one."""

LATEST_VERSION = MIGRATIONS[-1].version


def created_record_columns() -> dict[str, SqlType]:
    """Every audit record column the migrations create, with its SQL type."""
    return {name: sql_type for m in MIGRATIONS for name, sql_type in m.adds_record_columns}


def schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The highest applied version (0 for an empty database)."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


def migrate(conn: psycopg.Connection[tuple[object, ...]], where: str) -> list[int]:
    """Apply every pending migration in one transaction; returns the versions applied.

    Args:
        conn: A connection not inside a transaction.
        where: The database as shown in messages (a redacted DSN).

    Raises:
        ConfigError: The database has a newer schema than this code knows.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
            "description TEXT NOT NULL, applied_unix_ms BIGINT NOT NULL)"
        )
        current = schema_version(conn)
        if current > LATEST_VERSION:
            raise ConfigError(
                f"database {where}: schema version {current} is newer than this gateway "
                f"knows ({LATEST_VERSION}); upgrade the gateway before starting it"
            )
        applied = []
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (%s, %s, %s)",
                (migration.version, migration.description, int(time.time() * 1000)),
            )
            applied.append(migration.version)
    return applied
