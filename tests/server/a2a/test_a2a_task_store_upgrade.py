"""An A2A task store made by the release before conversations keeps working once upgraded.

SQLite: an older ``a2a-tasks.sqlite`` gets the new columns and the index of the
new unfinished states when opened. PostgreSQL: migration 10 widens the state
check, adds the columns and replaces the index; migration 12 adds the user a
task was started for. Either way the old rows read as before, as started for
no user, and waiting tasks are stored, listed and ended as orphans. A row an
older replica still running writes after migration 12 names no user it may
have had: no caller finds it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from gateway.inbound.invoke_handler import NO_USER
from gateway.postgres.migrations import MIGRATIONS
from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore
from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore
from gateway.server.a2a.task_store.store import A2ATaskStore, TaskFilter, TaskOutcome
from tests.helpers.a2a_grpc import a2a_task
from tests.helpers.postgres import state_pool

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
CONVERSATIONS_VERSION = 10
USER = ("user-1", "https://issuer.example")

_SQLITE_BEFORE = (
    "CREATE TABLE a2a_tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "task_id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, context_id TEXT NOT NULL, "
    "state TEXT NOT NULL, capability TEXT NOT NULL, served_version TEXT NOT NULL, "
    "output BLOB, evidence_sha256 TEXT NOT NULL, replayed INTEGER NOT NULL, "
    "reason TEXT NOT NULL, message TEXT NOT NULL, created_ms INTEGER NOT NULL, "
    "updated_ms INTEGER NOT NULL, runner TEXT NOT NULL DEFAULT '', "
    "lease_ms INTEGER NOT NULL DEFAULT 0, cancel_by TEXT NOT NULL DEFAULT '')",
    "CREATE INDEX a2a_tasks_owner ON a2a_tasks (owner, seq)",
    "CREATE TABLE a2a_task_chunks (task_id TEXT NOT NULL, owner TEXT NOT NULL, "
    "n INTEGER NOT NULL, chunk BLOB NOT NULL, PRIMARY KEY (task_id, n))",
    "CREATE INDEX a2a_tasks_unfinished ON a2a_tasks (lease_ms) "
    "WHERE state IN ('submitted', 'working')",
)
_OLD_ROWS = (
    ("done-1", "completed", b'{"text":"kept"}', "OK", "", "", 0),
    ("running-1", "working", b"", "", "half way", "a-dead-process", 1),
)


def _sqlite_before(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for statement in _SQLITE_BEFORE:
            db.execute(statement)
        for task_id, state, output, reason, message, runner, lease in _OLD_ROWS:
            db.execute(
                "INSERT INTO a2a_tasks (task_id, owner, context_id, state, capability, "
                "served_version, output, evidence_sha256, replayed, reason, message, "
                "created_ms, updated_ms, runner, lease_ms) "
                "VALUES (?, ?, 'ctx', ?, 'text.echo', '1.0.0', ?, 'e', 0, ?, ?, 1, 2, ?, ?)",
                (task_id, BOB, state, output, reason, message, runner, lease),
            )


def _postgres_before(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
            "description TEXT NOT NULL, applied_unix_ms BIGINT NOT NULL)"
        )
        for migration in MIGRATIONS:
            if migration.version < CONVERSATIONS_VERSION:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (%s, %s, 1)",
                    (migration.version, migration.description),
                )
        for task_id, state, output, reason, message, runner, lease in _OLD_ROWS:
            conn.execute(
                "INSERT INTO a2a_tasks (agent_id, task_id, owner, context_id, state, capability, "
                "served_version, output, evidence_sha256, replayed, reason, message, "
                "created_ms, updated_ms, runner, lease_ms) VALUES "
                "(%s, %s, %s, 'ctx', %s, 'text.echo', '1.0.0', %s, 'e', false, %s, %s, 1, 2, "
                "%s, %s)",
                (ALICE, task_id, BOB, state, output, reason, message, runner, lease),
            )


@pytest.fixture(params=["sqlite", "postgres"])
def upgraded(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], A2ATaskStore]:
    """Opens a store made by the release before: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        path = tmp_path / "a2a-tasks.sqlite"
        _sqlite_before(path)
        return lambda: SqliteA2ATaskStore(path)
    dsn = request.getfixturevalue("pg_dsn")
    _postgres_before(dsn)
    return lambda: PostgresA2ATaskStore(state_pool(dsn), ALICE)


async def test_old_rows_read_as_before_and_waiting_tasks_are_kept(
    upgraded: Callable[[], A2ATaskStore],
) -> None:
    store = upgraded()
    try:
        done = await store.get(BOB, "done-1")
        assert done is not None and done.state is TaskOutcome.COMPLETED
        assert done.user == NO_USER  # written before tasks kept their user
        assert await store.get(BOB, "done-1", USER) is None
        assert (done.output, done.status_json, done.history) == (b'{"text":"kept"}', b"", b"")
        waiting = replace(
            a2a_task(
                "asking-1",
                BOB,
                "trip.book",
                state=TaskOutcome.INPUT_REQUIRED,
                message="Where to?",
                created_ms=3,
            ),
            status_json=b'{"message_id":"q","parts":[]}',
            history=b'[{"message_id":"m","parts":[],"role":"user"}]',
        )
        assert await store.save(waiting, "this-process", 9_999_999_999_999)
        assert await store.get(BOB, "asking-1") == waiting
        page = await store.list(BOB, TaskFilter(state=TaskOutcome.INPUT_REQUIRED))
        assert [t.task_id for t in page.tasks] == ["asking-1"]
        # The old running row and the waiting one: both unfinished, both ended as orphans.
        ended = await store.fail_orphans(
            "a-new-process", 10, "TASK_INTERRUPTED", "gone", any_lease=True
        )
        assert sorted(t.task_id for t in ended) == ["asking-1", "running-1"]
        assert {t.state for t in ended} == {TaskOutcome.FAILED}
    finally:
        await store.flush()
        store.close()


def test_the_old_sqlite_index_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "a2a-tasks.sqlite"
    _sqlite_before(path)
    SqliteA2ATaskStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        indexes = {row[0]: row[1] for row in db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        )}  # fmt: skip
    assert "a2a_tasks_unfinished" not in indexes
    assert "'input-required', 'auth-required'" in indexes["a2a_tasks_open"]


async def test_a_row_an_older_replica_writes_after_the_upgrade_is_found_for_no_caller(
    pg_dsn: str,
) -> None:
    _postgres_before(pg_dsn)
    store = PostgresA2ATaskStore(state_pool(pg_dsn), ALICE)  # migrates to the latest
    try:
        assert (await store.get(BOB, "done-1")) is not None  # from before: no user
        with psycopg.connect(pg_dsn) as conn:  # the columns a gateway of migration 11 writes
            conn.execute(
                "INSERT INTO a2a_tasks (agent_id, task_id, owner, context_id, state, capability, "
                "served_version, output, evidence_sha256, replayed, reason, message, "
                "created_ms, updated_ms, status_json, history, asked_schema, runner, lease_ms) "
                "VALUES (%s, 'late-1', %s, 'ctx', 'working', 'trip.book', '1.0.0', '', '', "
                "false, '', '', 1, 2, '', '', '', 'old-process', 3)",
                (ALICE, BOB),
            )
        assert await store.get(BOB, "late-1") is None
        assert await store.get(BOB, "late-1", USER) is None
        listed = (await store.list(BOB, TaskFilter())).tasks
        assert sorted(t.task_id for t in listed) == ["done-1", "running-1"]  # not late-1
        whoever = await store.get(BOB, "late-1", None)
        assert whoever is not None and whoever.user == ("", "?")
    finally:
        store.close()
