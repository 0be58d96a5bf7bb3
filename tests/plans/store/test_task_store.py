"""The task state machine and the SQLite checkpoint (late results never win)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.plans import Plan, TaskNotFound
from gateway.plans.execution.verification import Confidence
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.sqlite import SqlitePlanTaskStore, Usage
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import (
    Evidence,
    InvalidTransition,
    PlanTaskState,
    RevisionRecord,
    StepResult,
    StepStatus,
    transition,
)
from tests.helpers.postgres import state_pool

PLAN = Plan.model_validate(
    {"goal": "g", "steps": [{"id": "a", "capability": "text.echo", "input": {"text": "x"}}]}
)


def result(status: StepStatus, revision: int, where: str = "local") -> StepResult:
    evidence = (
        Evidence("a", where, "1.0.0", 1, "ab" * 32) if status is StepStatus.COMPLETED else None
    )
    output = {"text": "x"} if evidence else None
    return StepResult("a", status, revision, where, 1, 1.0, output, evidence, reason="OK")


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (PlanTaskState.CREATED, PlanTaskState.RUNNING),
        (PlanTaskState.COMPLETED, PlanTaskState.RUNNING),
        (PlanTaskState.CANCELLED, PlanTaskState.FAILED),
        (PlanTaskState.PLANNING, PlanTaskState.WAITING_PEER),
    ],
)
def test_forbidden_transitions(current: PlanTaskState, new: PlanTaskState) -> None:
    with pytest.raises(InvalidTransition):
        transition(current, new)


def test_task_result_still_imports_as_the_deprecated_name_of_plan_task_result() -> None:
    from gateway.plans import task

    with pytest.warns(DeprecationWarning, match=r"TaskResult is now PlanTaskResult"):
        assert task.TaskResult is task.PlanTaskResult


def test_the_happy_path_is_allowed() -> None:
    state = PlanTaskState.CREATED
    for new in (
        PlanTaskState.PLANNING,
        PlanTaskState.RUNNING,
        PlanTaskState.WAITING_PEER,
        PlanTaskState.RUNNING,
        PlanTaskState.PLANNING,
        PlanTaskState.RUNNING,
        PlanTaskState.COMPLETED,
    ):
        state = transition(state, new)
    assert state.terminal


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], PlanTaskStore]:
    """Opens the same task store again each call: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return lambda: SqlitePlanTaskStore(tmp_path / "tasks.sqlite")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresPlanTaskStore(
        state_pool(dsn, "task store"), "spiffe://example.org/agent/alice"
    )


async def test_checkpoint_round_trip(open_store: Callable[[], PlanTaskStore]) -> None:
    store = open_store()
    await store.create("t1", PLAN, 1)
    await store.set_state("t1", PlanTaskState.RUNNING, Usage(1, 2, 0.5), 2, "OK", "")
    assert await store.record_step("t1", result(StepStatus.COMPLETED, 0))
    revised = PLAN.replace_step(PLAN.step("a").model_copy(update={"avoid": ("x",)}))
    await store.revise("t1", revised, RevisionRecord(1, "why", 3))
    store.close()
    again = open_store()
    loaded = await again.load("t1")
    again.close()
    assert (loaded.state, loaded.revision, loaded.usage) == (
        PlanTaskState.RUNNING,
        1,
        Usage(1, 2, 0.5),
    )
    assert loaded.plan == revised
    assert loaded.steps["a"] == result(StepStatus.COMPLETED, 0)
    assert loaded.revisions == (RevisionRecord(1, "why", 3),)


async def test_late_result_of_an_older_revision_never_overwrites(
    open_store: Callable[[], PlanTaskStore],
) -> None:
    store = open_store()
    await store.create("t1", PLAN, 1)
    assert await store.record_step("t1", result(StepStatus.FAILED, 2, "spiffe://x/b"))
    assert not await store.record_step("t1", result(StepStatus.COMPLETED, 1))
    assert await store.record_step("t1", result(StepStatus.COMPLETED, 2))
    assert not await store.record_step("t1", result(StepStatus.FAILED, 3))  # completed stays
    assert (await store.load("t1")).steps["a"].status is StepStatus.COMPLETED
    with pytest.raises(TaskNotFound):
        await store.load("nope")
    store.close()


async def test_a_verified_step_keeps_its_sources_and_candidates(
    open_store: Callable[[], PlanTaskStore],
) -> None:
    store = open_store()
    await store.create("t1", PLAN, 1)
    sources = (
        Evidence("a", "spiffe://example.org/agent/bob", "1.0.0", 5, "ab" * 32),
        Evidence("a", "spiffe://example.org/agent/carol", "1.0.0", 6, "cd" * 32),
    )
    verified = replace(
        result(StepStatus.COMPLETED, 0),
        confidence=Confidence.UNVERIFIED,
        sources=sources,
        candidates=({"text": "x"}, {"text": "y"}),
        asked_verification=True,
    )
    assert await store.record_step("t1", verified)
    store.close()
    again = open_store()
    assert (await again.load("t1")).steps["a"] == verified
    again.close()
