"""The A2A task store on each backend: owner and user scoping, pages, filters, reopening,
sharing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.errors import InvalidRequest, StateUnavailable
from gateway.inbound.invoke_handler import NO_USER
from gateway.server.a2a.task_store.postgres import PostgresA2ATaskStore
from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore
from gateway.server.a2a.task_store.store import (
    A2ATask,
    A2ATaskStore,
    TaskFilter,
    TaskOutcome,
    token_task_id,
)
from tests.helpers.a2a_task_rows import ALICE, BOB, CAROL, task
from tests.helpers.postgres import state_pool


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], A2ATaskStore]:
    """Opens the same A2A task store again each call: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return lambda: SqliteA2ATaskStore(tmp_path / "a2a-tasks.sqlite")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresA2ATaskStore(state_pool(dsn), ALICE)


async def test_a_task_is_its_owners_only_and_survives_reopening(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    mine, failed = task(1), task(2, state=TaskOutcome.FAILED)
    store.put(mine)
    store.put(failed)
    assert await store.get(BOB, "task-1") == mine  # the read waits for the queue
    assert await store.get(BOB, "task-2") == failed
    assert await store.get(CAROL, "task-1") is None  # the same answer as for no task at all
    assert await store.get(CAROL, "task-404") is None
    assert await store.get(BOB, "task-404") is None
    await store.flush()
    store.close()
    again = open_store()
    try:
        assert await again.get(BOB, "task-1") == mine
        assert await again.get(CAROL, "task-1") is None
        page = await again.list(CAROL, TaskFilter())
        assert (page.tasks, page.next_page_token, page.total_size) == ([], "", 0)
    finally:
        again.close()


async def test_a_flush_writes_the_gathered_tasks_at_once(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    store.put(task(1))
    store.put(task(2))  # both wait for others to share their write
    await store.flush()  # ends the wait: committed when it returns, not GATHER_SECONDS later
    other = open_store()  # another connection: only what was committed
    try:
        assert await other.get(BOB, "task-1") == task(1)
        assert await other.get(BOB, "task-2") == task(2)
    finally:
        other.close()
        store.close()


async def test_list_pages_newest_first_and_filters(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    try:
        for n in range(5):
            store.put(task(n, context_id="ctx-a" if n < 3 else "ctx-b"))
        store.put(task(5, CAROL))
        store.put(task(6, state=TaskOutcome.FAILED))
        first = await store.list(BOB, TaskFilter(page_size=3))
        assert [t.task_id for t in first.tasks] == ["task-6", "task-4", "task-3"]
        assert first.total_size == 6 and first.next_page_token
        second = await store.list(BOB, TaskFilter(page_size=3, page_token=first.next_page_token))
        assert [t.task_id for t in second.tasks] == ["task-2", "task-1", "task-0"]
        assert second.total_size == 6 and second.next_page_token == ""
        by_context = await store.list(BOB, TaskFilter(context_id="ctx-b"))
        assert [t.task_id for t in by_context.tasks] == ["task-4", "task-3"]
        assert by_context.total_size == 2
        failed = await store.list(BOB, TaskFilter(state=TaskOutcome.FAILED))
        assert [t.task_id for t in failed.tasks] == ["task-6"] and failed.total_size == 1
        recent = await store.list(BOB, TaskFilter(updated_after_ms=2_004))
        assert [t.task_id for t in recent.tasks] == ["task-6", "task-4"]
        clamped = await store.list(BOB, TaskFilter(page_size=0))
        assert [t.task_id for t in clamped.tasks] == ["task-6"] and clamped.total_size == 6
        carols = await store.list(CAROL, TaskFilter())
        assert [t.task_id for t in carols.tasks] == ["task-5"] and carols.total_size == 1
    finally:
        store.close()


@pytest.mark.parametrize("token", ["abc", "-1", "1", "²", "1" * 20, str(2**63), "dGFzay0x="])
async def test_a_token_it_did_not_hand_out_is_an_invalid_request(
    open_store: Callable[[], A2ATaskStore], token: str
) -> None:
    store = open_store()
    try:
        with pytest.raises(InvalidRequest) as info:
            await store.list(BOB, TaskFilter(page_token=token))
        assert info.value.reason == "INVALID_REQUEST"
    finally:
        store.close()


@pytest.mark.parametrize("task_id", ["\x00bad", "x" * 1_000_000, "id with space", "é", ""])
async def test_an_id_of_no_form_this_store_makes_is_simply_absent(
    open_store: Callable[[], A2ATaskStore], task_id: str
) -> None:
    store = open_store()
    try:
        store.put(task(1))
        assert await store.get(BOB, task_id) is None  # PostgreSQL cannot even hold NUL
        assert await store.get(BOB, "task-1") == task(1)
    finally:
        store.close()


async def test_a_token_names_its_owners_task_and_is_refused_for_another_owner(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    try:
        for n in range(3):
            store.put(task(n))
            store.put(task(10 + n, CAROL))
        first = await store.list(BOB, TaskFilter(page_size=1))
        assert token_task_id(first.next_page_token) == "task-2"  # bob's own, no row number
        with pytest.raises(InvalidRequest) as info:
            await store.list(CAROL, TaskFilter(page_token=first.next_page_token))
        assert (
            info.value.message == "page_token is not a token this agent handed out to this caller"
        )
        second = await store.list(BOB, TaskFilter(page_size=1, page_token=first.next_page_token))
        assert [t.task_id for t in second.tasks] == ["task-1"]
    finally:
        store.close()


USER_1 = ("user-1", "https://issuer.example")
USER_2 = ("user-2", "https://issuer.example")


def for_user(n: int, user: tuple[str, str], state: TaskOutcome = TaskOutcome.COMPLETED) -> A2ATask:
    return replace(task(n, state=state), on_behalf_of=user[0], user_issuer=user[1])


async def test_a_task_keeps_its_user_and_is_found_only_for_that_user(
    open_store: Callable[[], A2ATaskStore],
) -> None:
    store = open_store()
    mine, running = for_user(1, USER_1), for_user(2, USER_1, TaskOutcome.WORKING)
    store.put(mine)
    assert await store.save(running, "a-process", 9_999_999_999_999)
    store.put(task(3))  # bob's, for no user
    store.put(for_user(4, (USER_1[0], "https://another-issuer.example")))  # same subject
    await store.flush()
    store.close()
    store = open_store()
    try:
        assert await store.get(BOB, "task-1", USER_1) == mine
        assert await store.get(BOB, "task-2", USER_1) == running
        assert (mine.user, running.user) == (USER_1, USER_1)
        for other in (USER_2, NO_USER, (USER_1[0], "https://another-issuer.example")):
            assert await store.get(BOB, "task-1", other) is None  # as for no task at all
        assert await store.get(BOB, "task-1") is None  # a read names no user unless told
        assert await store.get(CAROL, "task-1", USER_1) is None
        assert await store.get(BOB, "task-1", None) == mine  # whoever it was started for
        assert (await store.get(BOB, "task-3")) == task(3)
        page = await store.list(BOB, TaskFilter(), USER_1)
        assert ([t.task_id for t in page.tasks], page.total_size) == (["task-2", "task-1"], 2)
        assert [t.task_id for t in (await store.list(BOB, TaskFilter())).tasks] == ["task-3"]
        assert (await store.list(BOB, TaskFilter(), USER_2)).total_size == 0
        first = await store.list(BOB, TaskFilter(page_size=1), USER_1)
        with pytest.raises(InvalidRequest):  # user-1's task names no page of anyone else's
            await store.list(BOB, TaskFilter(page_token=first.next_page_token), USER_2)
        # A later save (its state) never changes whom the task was started for.
        assert await store.save(replace(running, state=TaskOutcome.COMPLETED, on_behalf_of="x"))
        assert await store.get(BOB, "task-2", ("x", USER_1[1])) is None
        ended = await store.get(BOB, "task-2", USER_1)
        assert ended is not None and ended.state is TaskOutcome.COMPLETED
    finally:
        store.close()


async def test_replicas_of_one_agent_share_tasks_other_agents_do_not(pg_dsn: str) -> None:
    one = PostgresA2ATaskStore(state_pool(pg_dsn), ALICE)
    two = PostgresA2ATaskStore(state_pool(pg_dsn), ALICE)
    other = PostgresA2ATaskStore(state_pool(pg_dsn), "spiffe://example.org/agent/dave")
    try:
        one.put(task(1))
        await one.flush()
        assert await two.get(BOB, "task-1") == task(1)
        assert [t.task_id for t in (await two.list(BOB, TaskFilter())).tasks] == ["task-1"]
        assert await other.get(BOB, "task-1") is None
        assert (await other.list(BOB, TaskFilter())).total_size == 0
        other.put(task(1))  # the same task id under another agent id is another task
        assert await other.get(BOB, "task-1") == task(1)
        assert (await two.list(BOB, TaskFilter())).total_size == 1
    finally:
        for store in (one, two, other):
            store.close()


@pytest.mark.slow
async def test_an_unreachable_database_fails_reads_and_logs_no_payload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed = state_pool("postgresql://postgres@127.0.0.1:1/nowhere", "A2A task store")
    store = PostgresA2ATaskStore(closed, ALICE)
    try:
        with caplog.at_level(logging.ERROR):
            store.put(task(1))
            await store.flush()
        lost = [r for r in caplog.records if r.name.endswith("task_store.postgres")]
        assert [r.getMessage().split(":")[:2] for r in lost] == [
            ["A2A task store", " 1 tasks not stored"]
        ]
        assert "payload-never-logged" not in caplog.text
        with pytest.raises(StateUnavailable) as info:
            await store.get(BOB, "task-1")
        assert info.value.reason == "STATE_UNAVAILABLE"
        with pytest.raises(StateUnavailable):
            await store.list(BOB, TaskFilter())
    finally:
        store.close()
