"""A failed write's "may have written" is a checkpointed field of its own.

It used to be read back from the wording of a note on resume; now it is a column
(SQLite) / migration 5 (PostgreSQL), and rows an older release wrote are filled
from that note once, when the column is added.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import psycopg
import pytest

from gateway.plans import Plan
from gateway.plans.execution.attempt_rules import written_note
from gateway.plans.store import rows
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.sqlite import SCHEMA, SqlitePlanTaskStore
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import StepResult, StepStatus
from gateway.postgres.migrations import MIGRATIONS
from tests.helpers.postgres import state_pool

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
PLAN = Plan.model_validate(
    {
        "goal": "g",
        "steps": [
            {"id": "a", "capability": "kv.put", "input": {"key": "k", "value": 1}},
            {"id": "b", "capability": "kv.put", "input": {"key": "k", "value": 2}},
        ],
    }
)
WRITTEN_VERSION = 5


def failed(step: str, *, written: bool, notes: tuple[str, ...] = ()) -> StepResult:
    return StepResult(
        step,
        StepStatus.FAILED,
        0,
        BOB,
        1,
        1.0,
        reason="PEER_UNAVAILABLE",
        notes=notes,
        may_have_written=written,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    if request.param == "sqlite":
        return lambda: SqlitePlanTaskStore(tmp_path / "tasks.sqlite")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresPlanTaskStore(state_pool(dsn, "task store"), ALICE)


async def test_the_flag_round_trips_without_any_note(open_store: object) -> None:
    store: PlanTaskStore = open_store()  # type: ignore[operator]
    await store.create("t1", PLAN, 1)
    assert await store.record_step("t1", failed("a", written=True))
    assert await store.record_step("t1", failed("b", written=False, notes=(written_note(BOB),)))
    store.close()
    again: PlanTaskStore = open_store()  # type: ignore[operator]
    loaded = await again.load("t1")
    again.close()
    # The field says it, not the note: a note alone no longer sets the flag.
    assert (loaded.steps["a"].may_have_written, loaded.steps["b"].may_have_written) == (True, False)


def _old_sqlite_store(path: Path, results: list[StepResult]) -> None:
    """Task ``t1`` in a store made before the column: the release's steps table."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for statement in SCHEMA:
            db.execute(statement.replace("may_have_written INTEGER NOT NULL DEFAULT 0, ", ""))
        db.execute(
            "INSERT INTO tasks (task_id, plan_json, state, revision, reason, message, "
            "steps_used, peer_calls, elapsed, created_ms, updated_ms, tool_calls) "
            "VALUES (?, ?, 'running', 0, 'OK', '', 1, 1, 0.0, 1, 1, 0)",
            ("t1", PLAN.to_json()),
        )
        marks = ", ".join(["?"] * 19)
        for result in results:
            db.execute(f"INSERT INTO steps VALUES ({marks})", rows.step_row("t1", result)[:-1])


def _old_postgres_store(dsn: str, results: list[StepResult]) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
            "description TEXT NOT NULL, applied_unix_ms BIGINT NOT NULL)"
        )
        for migration in MIGRATIONS:
            if migration.version < WRITTEN_VERSION:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (%s, %s, 1)",
                    (migration.version, migration.description),
                )
        conn.execute(
            "INSERT INTO tasks VALUES (%s, 't1', %s, 'running', 0, 'OK', '', 1, 1, 0.0, 1, 1, 0)",
            (ALICE, PLAN.to_json()),
        )
        for result in results:
            values = (ALICE, *rows.step_row("t1", result)[:-1])
            conn.execute(f"INSERT INTO task_steps VALUES ({', '.join(['%s'] * 20)})", values)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_rows_of_an_older_release_are_filled_from_their_note(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    old = [
        failed("a", written=False, notes=("skipped carol: RATE_LIMITED", written_note(BOB))),
        failed("b", written=False, notes=(f"{BOB}: abandoned while running there",)),
    ]
    store: PlanTaskStore
    if backend == "sqlite":
        _old_sqlite_store(tmp_path / "tasks.sqlite", old)
        store = SqlitePlanTaskStore(tmp_path / "tasks.sqlite")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        _old_postgres_store(dsn, old)
        store = PostgresPlanTaskStore(state_pool(dsn, "task store"), ALICE)
    loaded = await store.load("t1")
    store.close()
    assert loaded.steps["a"].may_have_written is True
    assert loaded.steps["b"].may_have_written is False
    assert loaded.steps["a"].notes == old[0].notes  # the notes themselves are unchanged
