"""Approval requests and decisions in both task stores, and an older SQLite file upgraded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from capabilities.contract import Risk
from gateway.errors import TaskLeased, TaskNotFound
from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import Decision, needs_approval, request_for, threshold
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.records import Usage
from gateway.plans.store.sqlite import SqlitePlanTaskStore
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import PlanTaskState
from tests.helpers.postgres import state_pool

PLAN = Plan.model_validate({"goal": "g", "steps": [{"id": "s", "capability": "a.b"}]})


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> PlanTaskStore:
    if request.param == "sqlite":
        return SqlitePlanTaskStore(tmp_path / "tasks.sqlite")
    dsn = request.getfixturevalue("pg_dsn")
    return PostgresPlanTaskStore(state_pool(dsn, "task store"), "spiffe://example.org/agent/alice")


async def test_request_then_decide_once(store: PlanTaskStore) -> None:
    await store.create("t1", PLAN, 1000)
    await store.take_lease("t1", "me", 1000, 30)
    request = request_for("s", "a.b", "spiffe://x/agent/bob", "1.0.0", Risk.WRITE, {"k": "vv"})
    assert request.fields == {"k": 4}
    await store.request_approval("t1", request, owner="me")
    with pytest.raises(TaskLeased):  # the task is running: no decision now
        await store.decide_approval("t1", "s", Decision.APPROVED, "u", 2000)
    await store.release_lease("t1", "me")
    with pytest.raises(TaskLeased):  # fenced: a run without the lease records nothing
        await store.request_approval("t1", request, owner="me")
    decided = await store.decide_approval("t1", "s", Decision.DENIED, "u pid 1", 2000)
    assert (decided.decision, decided.decided_by) == (Decision.DENIED, "u pid 1")
    assert (await store.load("t1")).approvals == {"s": decided}
    with pytest.raises(TaskNotFound):  # decided already
        await store.decide_approval("t1", "s", Decision.APPROVED, "u", 3000)
    with pytest.raises(TaskNotFound):
        await store.decide_approval("t1", "other", Decision.APPROVED, "u", 3000)
    store.close()


async def test_tool_calls_survive_a_checkpoint(store: PlanTaskStore) -> None:
    await store.create("t1", PLAN, 1000)
    await store.set_state("t1", PlanTaskState.RUNNING, Usage(2, 1, 0.5, 3), 1500, "OK", "")
    assert (await store.load("t1")).usage == Usage(2, 1, 0.5, 3)
    store.close()


def test_binding_and_thresholds() -> None:
    one = request_for("s", "a.b", "bob", "1.0.0", Risk.WRITE, {"k": "v"})
    assert one.binds(request_for("s", "a.b", "bob", "1.0.0", Risk.WRITE, {"k": "v"}))
    assert not one.binds(request_for("s", "a.b", "bob", "1.0.0", Risk.WRITE, {"k": "w"}))
    assert not one.binds(request_for("s", "a.b", "carol", "1.0.0", Risk.WRITE, {"k": "v"}))
    assert not one.binds(request_for("s", "a.b", "bob", "1.1.0", Risk.WRITE, {"k": "v"}))
    assert threshold(Risk.EXTERNAL, Risk.WRITE) is Risk.WRITE
    assert threshold(None, None) is None
    assert needs_approval(Risk.EXTERNAL, Risk.WRITE) and not needs_approval(Risk.READ, Risk.WRITE)
    assert not needs_approval(Risk.EXTERNAL, None)


async def test_a_store_made_before_verification_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE tasks (task_id TEXT PRIMARY KEY, plan_json TEXT NOT NULL, "
        "state TEXT NOT NULL, revision INTEGER NOT NULL, reason TEXT NOT NULL, "
        "message TEXT NOT NULL, steps_used INTEGER NOT NULL, peer_calls INTEGER NOT NULL, "
        "elapsed REAL NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL)"
    )
    db.execute(
        "INSERT INTO tasks VALUES ('old', ?, 'failed', 0, 'X', '', 1, 2, 0.5, 1, 2)",
        (PLAN.to_json(),),
    )
    db.commit()
    db.close()
    store = SqlitePlanTaskStore(path)
    old = await store.load("old")
    assert (old.state, old.usage.peer_calls, old.usage.tool_calls) == (PlanTaskState.FAILED, 2, 0)
    await store.create("new", PLAN, 5)
    assert (await store.load("new")).usage.tool_calls == 0
    store.close()
