"""A task's start and cancel when calls overlap: never a task that nobody runs or ends.

Found by an attack round: a caller whose deadline passed (or who hung up)
while its background task's row was being written left that row SUBMITTED
for good (the write, in a thread, lands whatever the cancel), never run,
never audited, a ``CancelTask`` of it answered "already finished"; and a
second ``CancelTask`` while a first was still ending the task answered
``TASK_NOT_CANCELABLE`` "the task has already finished" of a task still
``WORKING``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2

from gateway.runtime.agent import Agent
from gateway.server.a2a.task_store.store import TaskFilter, TaskOutcome
from tests.helpers.a2a_grpc import V1, A2APeer, data_request
from tests.helpers.agents import AgentFactory, Pki, audit_rows, spiffe
from tests.helpers.task_agents import task_grants
from tests.helpers.task_capabilities import TaskGate

BOB = spiffe("bob")


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def alice(make_agent: AgentFactory, gate: TaskGate) -> Agent:
    bob = {"capabilities": ["job.run", "job.linger"]}
    return await make_agent(grants=task_grants(bob), capabilities=gate.capabilities())


def background(capability: str) -> a2a_pb2.SendMessageRequest:
    request = data_request(capability, {"tag": "t"})
    request.configuration.return_immediately = True
    return request


async def test_a_caller_gone_while_its_task_is_saved_leaves_an_ended_audited_task(
    pki: Pki, tmp_path: Path, alice: Agent, gate: TaskGate
) -> None:
    store = sqlite3.connect(tmp_path / "alice-state" / "a2a-tasks.sqlite", isolation_level=None)
    store.execute("BEGIN IMMEDIATE")  # a sibling worker's write: the row must wait for it
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bob.stub.SendMessage(background("job.run"), metadata=V1, timeout=0.5)
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        store.execute("COMMIT")
        store.close()
    ended = None
    for _ in range(200):  # bounded: the row lands, then its end
        page = await alice.a2a_tasks.list(BOB, TaskFilter())
        ended = page.tasks[0] if page.tasks and page.tasks[0].state.finished else None
        if ended is not None:
            break
        await asyncio.sleep(0.05)
    assert ended is not None, "the task was never ended"
    assert (ended.state, ended.reason) == (TaskOutcome.CANCELED, "CANCELLED")
    await alice.audit.flush()
    ran = [r for r in audit_rows(alice.config.audit_db) if r.capability == "job.run"]
    assert [(r.peer_id, r.decision, r.reason, r.task_id) for r in ran] == [
        (BOB, "allow", "CANCELLED", ended.task_id)
    ]
    assert gate.runs == 0
    assert alice.limit_stats().in_flight_total == 0
    assert len(alice.a2a_runs) == 0


async def test_a_second_cancel_while_the_first_ends_the_task_answers_the_same_end(
    pki: Pki, alice: Agent, gate: TaskGate
) -> None:
    async with A2APeer(pki, alice, "bob") as bob:
        task = await bob.send(background("job.linger"))
        await asyncio.wait_for(gate.started.wait(), 10)
        cancel = a2a_pb2.CancelTaskRequest(id=task.id)
        first = asyncio.ensure_future(bob.stub.CancelTask(cancel, metadata=V1, timeout=20))
        await asyncio.wait_for(gate.cancelled.wait(), 10)  # the capability is cleaning up
        second = asyncio.ensure_future(bob.stub.CancelTask(cancel, metadata=V1, timeout=20))
        await asyncio.sleep(0.2)  # the second is in, waiting for the same end
        assert not second.done()
        gate.next_step.set()
        answers = await asyncio.gather(first, second)
    assert [a.status.state for a in answers] == [a2a_pb2.TASK_STATE_CANCELED] * 2
    await alice.audit.flush()
    ran = [r for r in audit_rows(alice.config.audit_db) if r.capability == "job.linger"]
    assert [(r.decision, r.reason) for r in ran] == [("allow", "CANCELLED")]
    assert gate.runs == 1
