"""The background-task statements of the A2A task store, on SQLite and PostgreSQL.

A finished row never changes; orphans of a dead process end FAILED with
TASK_INTERRUPTED (any lease at a lone process's start, else only once the
lease has passed); retention deletes finished tasks only. A running task's
output chunks are kept in order, for its owner only, once each, and go with
the task's end.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.config import A2ASettings
from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore
from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore
from gateway.server.a2a.task_store.store import A2ATask, A2ATaskStore, TaskOutcome
from tests.helpers.a2a_task_rows import ALICE, BOB, CAROL, task
from tests.helpers.postgres import state_pool

ME, GONE = "runner-me", "runner-gone"


def running(n: int, state: TaskOutcome = TaskOutcome.WORKING) -> A2ATask:
    return replace(task(n), state=state, output=b"", reason="", message="")


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], A2ATaskStore]:
    if request.param == "sqlite":
        return lambda: SqliteA2ATaskStore(tmp_path / "a2a-tasks.sqlite")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresA2ATaskStore(state_pool(dsn), ALICE)


async def test_a_finished_task_never_changes_again(open_store: Callable[[], A2ATaskStore]) -> None:
    store = open_store()
    try:
        assert await store.save(running(1, TaskOutcome.SUBMITTED), ME, 10**13)
        assert await store.save(running(1), ME, 10**13)
        assert (await store.get(BOB, "task-1")) == running(1)
        done = task(1)
        assert await store.save(done)
        assert not await store.save(running(1), ME, 10**13)  # a late WORKING loses
        assert not await store.save(replace(done, state=TaskOutcome.CANCELED))
        assert await store.get(BOB, "task-1") == done
    finally:
        store.close()


async def test_orphans_end_failed_with_the_reason_and_live_leases_are_kept(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    try:
        await store.save(running(1), GONE, lease_ms=1_000)  # lease long passed
        await store.save(running(2), GONE, lease_ms=10**13)  # another live process
        await store.save(running(3, TaskOutcome.SUBMITTED), ME, lease_ms=1_000)  # mine
        await store.save(task(4))  # finished: untouched
        ended = await store.fail_orphans(ME, 5_000, "TASK_INTERRUPTED", "gone", any_lease=False)
        assert [t.task_id for t in ended] == ["task-1"]
        one = await store.get(BOB, "task-1")
        assert one is not None
        assert (one.state, one.reason, one.message, one.updated_ms) == (
            TaskOutcome.FAILED,
            "TASK_INTERRUPTED",
            "gone",
            5_000,
        )
        assert (await store.get(BOB, "task-2")) == running(2)
        # A lone process at its start: no other can be running, whatever the lease says.
        ended = await store.fail_orphans(ME, 6_000, "TASK_INTERRUPTED", "gone", any_lease=True)
        assert [t.task_id for t in ended] == ["task-2"]
        assert (await store.get(BOB, "task-3")) == running(3, TaskOutcome.SUBMITTED)
        assert (await store.get(BOB, "task-4")) == task(4)
        await store.renew_leases(ME, 10**13)
        ended = await store.fail_orphans("someone", 7_000, "X", "y", any_lease=False)
        assert ended == ()  # task-3's lease was renewed
    finally:
        store.close()


async def test_a_cancel_request_reaches_the_runner_of_an_unfinished_task_only(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    try:
        await store.save(running(1), ME, 10**13)
        store.put(task(2))
        assert not await store.request_cancel(BOB, "task-2", BOB)  # finished
        assert not await store.request_cancel("spiffe://example.org/agent/carol", "task-1", BOB)
        assert await store.cancel_requests(ME) == ()
        assert await store.request_cancel(BOB, "task-1", BOB)
        assert await store.cancel_requests(ME) == (("task-1", BOB),)
        assert await store.cancel_requests(GONE) == ()
        await store.save(replace(task(1), state=TaskOutcome.CANCELED))
        assert await store.cancel_requests(ME) == ()  # it ended: nothing left to do
    finally:
        store.close()


async def test_retention_deletes_finished_tasks_only(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    try:
        old, recent = task(1), task(2)  # updated_ms 2_001, 2_002
        store.put(old)
        store.put(recent)
        await store.save(replace(task(3), updated_ms=100, state=TaskOutcome.CANCELED))
        await store.save(replace(running(4), updated_ms=100), ME, 10**13)
        assert await store.prune(before_ms=2_002) == 2
        assert await store.get(BOB, "task-1") is None
        assert await store.get(BOB, "task-3") is None
        assert await store.get(BOB, "task-2") == recent
        assert (await store.get(BOB, "task-4")) is not None  # unfinished: never pruned
    finally:
        store.close()


async def test_chunks_are_kept_in_order_for_their_owner_once_each_until_the_end(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    chunks = [b'{"n":%d}' % n for n in range(450)]  # more than one statement's worth
    try:
        await store.save(running(1), ME, 10**13)
        await store.save(running(2), ME, 10**13)
        assert await store.chunk_count(BOB, "task-1") == 0
        await store.add_chunks(BOB, "task-1", 0, chunks[:300])
        await store.add_chunks(BOB, "task-1", 250, chunks[250:])  # a retry overlapping
        await store.add_chunks(BOB, "task-2", 0, [b'{"other":1}'])
        assert await store.chunk_count(BOB, "task-1") == 450
        read = [
            *await store.chunks_from(BOB, "task-1", 0),
            *await store.chunks_from(BOB, "task-1", 200),
        ]
        read += await store.chunks_from(BOB, "task-1", 400)
        assert read == chunks
        assert await store.chunks_from(CAROL, "task-1", 0) == ()  # another peer's task
        assert await store.chunk_count(CAROL, "task-1") == 0
        await store.drop_chunks("task-1")
        assert await store.chunks_from(BOB, "task-1", 0) == ()
        await store.add_chunks(BOB, "task-3", 0, [b'{"left":1}'])  # its row never written
        assert await store.prune(before_ms=0) == 0
        assert await store.chunks_from(BOB, "task-2", 0) == (b'{"other":1}',)  # running: kept
        assert await store.chunks_from(BOB, "task-3", 0) == ()  # no running task: pruned
        await store.save(task(2))
        await store.prune(before_ms=0)
        assert await store.chunks_from(BOB, "task-2", 0) == ()  # ended: pruned
    finally:
        store.close()


def test_a_store_file_from_before_background_tasks_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "a2a-tasks.sqlite"
    with sqlite3.connect(path) as db:  # the schema as released before runner/lease_ms
        db.execute(
            "CREATE TABLE a2a_tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "task_id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, context_id TEXT NOT NULL, "
            "state TEXT NOT NULL, capability TEXT NOT NULL, served_version TEXT NOT NULL, "
            "output BLOB, evidence_sha256 TEXT NOT NULL, replayed INTEGER NOT NULL, "
            "reason TEXT NOT NULL, message TEXT NOT NULL, created_ms INTEGER NOT NULL, "
            "updated_ms INTEGER NOT NULL)"
        )
    store = SqliteA2ATaskStore(path)
    store.close()
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(a2a_tasks)")}
    assert {"runner", "lease_ms"} <= columns


def test_task_retention_is_a_positive_duration() -> None:
    assert A2ASettings().task_retention == timedelta(days=7)
    assert A2ASettings.model_validate({"task_retention": "90m"}).task_retention == timedelta(
        minutes=90
    )
    for bad in ("0s", "-1d", "soon"):
        with pytest.raises(ValueError, match="task_retention"):
            A2ASettings.model_validate({"task_retention": bad})
