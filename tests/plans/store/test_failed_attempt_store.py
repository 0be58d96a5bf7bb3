"""Failed attempts are checkpointed with the step result that reports them (SQLite, PostgreSQL).

They are the executor's memory against stagnation, so they must survive a
reopen of the store, be written in the same transaction as the result (never
one without the other), hold digests only, and a store written before they
existed must open and load with an empty memory.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from gateway.errors import TaskLeased
from gateway.plans import Plan
from gateway.plans.execution.verification import comparison_digest
from gateway.plans.store import rows
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.sqlite import SCHEMA, FailedAttempt, SqlitePlanTaskStore
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import StepResult, StepStatus
from gateway.postgres.migrations import LATEST_VERSION, MIGRATIONS
from tests.helpers.postgres import state_pool

FAILED_ATTEMPTS_VERSION = 4
"""The PostgreSQL migration that added ``task_failed_attempts``."""

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
PLAN = Plan.model_validate(
    {"goal": "g", "steps": [{"id": "a", "capability": "text.echo", "input": {"text": "x"}}]}
)
DIGEST = comparison_digest({"text": "secret input"})
ON_BOB = FailedAttempt("a", BOB, DIGEST)


def failed(revision: int, where: str = BOB) -> StepResult:
    return StepResult("a", StepStatus.FAILED, revision, where, 1, 1.0, reason="INVALID_OUTPUT")


def completed(revision: int) -> StepResult:
    return StepResult("a", StepStatus.COMPLETED, revision, "local", 1, 1.0, {"text": "x"})


@dataclass
class Backend:
    """One task store backend: open it, look at its tables, or make it as an older
    release left it (before failed attempts were remembered)."""

    sqlite_path: Path | None = None
    dsn: str = ""

    def open(self) -> PlanTaskStore:
        if self.sqlite_path is not None:
            return SqlitePlanTaskStore(self.sqlite_path)
        return PostgresPlanTaskStore(state_pool(self.dsn, "task store"), ALICE)

    def columns(self) -> list[str]:
        """The columns of the failed attempts table, in order."""
        if self.sqlite_path is not None:
            with contextlib.closing(sqlite3.connect(self.sqlite_path)) as db:
                return [str(r[1]) for r in db.execute("PRAGMA table_info(failed_attempts)")]
        with psycopg.connect(self.dsn) as conn:
            found = conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'task_failed_attempts' ORDER BY ordinal_position"
            ).fetchall()
        return [str(r[0]) for r in found]

    def write_as_before(self, result: StepResult) -> None:
        """Task ``t1`` with ``result``, in a store made by the release before this table."""
        if self.sqlite_path is not None:
            with contextlib.closing(sqlite3.connect(self.sqlite_path)) as db, db:
                for statement in SCHEMA:
                    if "failed_attempts" not in statement:
                        db.execute(statement)
                db.execute(
                    "INSERT INTO tasks (task_id, plan_json, state, revision, reason, message, "
                    "steps_used, peer_calls, elapsed, created_ms, updated_ms, tool_calls) "
                    "VALUES (?, ?, 'running', 0, 'OK', '', 1, 1, 0.0, 1, 1, 0)",
                    ("t1", PLAN.to_json()),
                )
                marks = ", ".join(["?"] * 20)
                db.execute(f"INSERT INTO steps VALUES ({marks})", rows.step_row("t1", result))
            return
        with psycopg.connect(self.dsn) as conn:
            conn.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                "description TEXT NOT NULL, applied_unix_ms BIGINT NOT NULL)"
            )
            for migration in MIGRATIONS:
                if migration.version < FAILED_ATTEMPTS_VERSION:
                    for statement in migration.statements:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_migrations VALUES (%s, %s, 1)",
                        (migration.version, migration.description),
                    )
            conn.execute(
                "INSERT INTO tasks VALUES (%s, 't1', %s, 'running', 0, 'OK', '', 1, 1, 0.0, "
                "1, 1, 0)",
                (ALICE, PLAN.to_json()),
            )
            values = (ALICE, *rows.step_row("t1", result)[:-1])  # before may_have_written
            conn.execute(f"INSERT INTO task_steps VALUES ({', '.join(['%s'] * 20)})", values)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend(sqlite_path=tmp_path / "tasks.sqlite")
    return Backend(dsn=request.getfixturevalue("pg_dsn"))


async def test_a_failed_attempt_survives_a_reopen(backend: Backend) -> None:
    store = backend.open()
    await store.create("t1", PLAN, 1)
    assert await store.record_step("t1", failed(0), failed=ON_BOB)
    assert await store.record_step("t1", failed(1), failed=ON_BOB)  # remembered once
    elsewhere = FailedAttempt("a", "local", DIGEST)
    assert await store.record_step("t1", failed(2, "local"), failed=elsewhere)
    await store.create("t2", PLAN, 1)  # another task's memory is its own
    store.close()
    again = backend.open()
    loaded, other = await again.load("t1"), await again.load("t2")
    again.close()
    assert loaded.failed_attempts == frozenset({ON_BOB, elsewhere})
    assert loaded.steps["a"] == failed(2, "local")
    assert other.failed_attempts == frozenset()


async def test_an_attempt_is_remembered_only_with_its_result(
    backend: Backend,
) -> None:
    store = backend.open()
    await store.create("t1", PLAN, 1)
    assert await store.record_step("t1", failed(2), failed=ON_BOB)
    late = FailedAttempt("a", "local", DIGEST)
    assert not await store.record_step("t1", failed(1, "local"), failed=late)  # older revision
    assert await store.record_step("t1", completed(2))
    after = FailedAttempt("a", "spiffe://example.org/agent/carol", DIGEST)
    assert not await store.record_step("t1", failed(3), failed=after)  # completed stays
    assert (await store.load("t1")).failed_attempts == frozenset({ON_BOB})
    store.close()


async def test_a_run_without_the_lease_records_neither_result_nor_attempt(
    backend: Backend,
) -> None:
    store = backend.open()
    await store.create("t1", PLAN, 1000)
    await store.take_lease("t1", "host:1:old", 1000, 1.0)
    await store.take_lease("t1", "host:2:new", 5000, 30.0)  # the old lease had expired
    with pytest.raises(TaskLeased):
        await store.record_step("t1", failed(0), owner="host:1:old", failed=ON_BOB)
    loaded = await store.load("t1")
    assert (loaded.steps, loaded.failed_attempts) == ({}, frozenset())
    assert await store.record_step("t1", failed(0), owner="host:2:new", failed=ON_BOB)
    assert (await store.load("t1")).failed_attempts == frozenset({ON_BOB})
    store.close()


async def test_the_memory_holds_digests_only(backend: Backend) -> None:
    store = backend.open()
    await store.create("t1", PLAN, 1)  # the PostgreSQL schema is made by the first use
    store.close()
    # No column could hold input content: ids, where, and the input's digest.
    assert backend.columns()[-4:] == ["task_id", "step_id", "where_", "input_sha256"]
    assert len(backend.columns()) == (4 if backend.sqlite_path else 5)


async def test_a_store_written_before_opens_with_an_empty_memory(backend: Backend) -> None:
    backend.write_as_before(failed(0))
    store = backend.open()
    loaded = await store.load("t1")
    assert (loaded.steps, loaded.failed_attempts) == ({"a": failed(0)}, frozenset())
    assert await store.record_step("t1", failed(1), failed=ON_BOB)
    assert (await store.load("t1")).failed_attempts == frozenset({ON_BOB})
    store.close()
    assert backend.columns()[-4:] == ["task_id", "step_id", "where_", "input_sha256"]
    if backend.dsn:
        with psycopg.connect(backend.dsn) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
        assert versions == list(range(1, LATEST_VERSION + 1))
