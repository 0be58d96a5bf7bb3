"""Answers left for the process running a task (``a2a_task_inputs``), on each backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.server.a2a.task_store.inputs import PENDING, REFUSED, TAKEN, WITHDRAWN, PendingInput
from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore
from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore
from gateway.server.a2a.task_store.store import A2ATaskStore, TaskOutcome
from tests.helpers.a2a_grpc import a2a_task
from tests.helpers.postgres import state_pool

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
CAROL = "spiffe://example.org/agent/carol"
LEASE = 9_999_999_999_999


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], A2ATaskStore]:
    if request.param == "sqlite":
        return lambda: SqliteA2ATaskStore(tmp_path / "a2a-tasks.sqlite")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresA2ATaskStore(state_pool(dsn), ALICE)


async def test_one_side_decides_how_a_left_answer_ends(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    try:
        waiting = a2a_task("t-1", BOB, "trip.book", state=TaskOutcome.INPUT_REQUIRED)
        working = a2a_task("t-2", BOB, "trip.book", state=TaskOutcome.WORKING)
        for task in (waiting, working):
            await store.save(task, "runner-a", LEASE)
        assert await store.leave_input(BOB, "t-1", "m-1", b'{"city":"Oslo"}', b"[]", 1)
        assert not await store.leave_input(BOB, "t-1", "m-1", b"{}", b"[]", 2)  # once per id
        assert await store.leave_input(BOB, "t-2", "m-2", b"{}", b"[]", 3)
        # Only the runner of a task that waits sees an answer to it.
        assert await store.pending_inputs("runner-a") == (
            PendingInput("t-1", "m-1", b'{"city":"Oslo"}', b"[]"),
        )
        assert await store.pending_inputs("runner-b") == ()
        assert await store.input_state(BOB, "t-1", "m-1") == PENDING
        assert await store.input_state(CAROL, "t-1", "m-1") is None  # another owner's: none
        assert await store.end_input("t-1", "m-1", TAKEN)
        assert not await store.end_input("t-1", "m-1", WITHDRAWN)  # decided already
        assert await store.input_state(BOB, "t-1", "m-1") == TAKEN
        assert await store.pending_inputs("runner-a") == ()
        await store.forget_input(BOB, "t-1", "m-1")
        assert await store.input_state(BOB, "t-1", "m-1") is None
        assert await store.end_input("t-2", "m-2", REFUSED)
        # An answer left to a task that has ended goes with the retention sweep.
        await store.save(replace(working, state=TaskOutcome.FAILED))
        await store.prune(0)
        assert await store.input_state(BOB, "t-2", "m-2") is None
    finally:
        await store.flush()
        store.close()
