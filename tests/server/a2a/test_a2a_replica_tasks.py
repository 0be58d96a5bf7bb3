"""Background tasks on two replicas of one agent id sharing PostgreSQL.

A task started on one replica is seen running from the other, and a
CancelTask sent to the other cancels it where it runs (a recorded request
that replica carries out); a replica's tasks are never taken for orphans
while its lease is live. A SubscribeToTask sent to the other replica follows
the task through the shared table to its terminal event (owner only, one
place in flight while open), with the progress texts and the output chunks
emitted after it began, and ends with a precise error when that replica
stops or the task outlives its timeout and lease.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.audit import query_records
from gateway.audit.filter import AuditFilter
from gateway.runtime.agent import Agent
from gateway.server.a2a import task_follow
from gateway.server.a2a.task_store.store import TaskOutcome
from gateway.storage import location, open_audit_reader
from tests.helpers.a2a_grpc import V1, A2APeer, a2a_task, data_request, error_infos
from tests.helpers.agents import (
    Pki,
    grant,
    spiffe,
    started_replicas,
    write_policy,
)
from tests.helpers.task_capabilities import TaskGate


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def replicas(
    pki: Pki, tmp_path: Path, pg_dsn: str, gate: TaskGate
) -> AsyncIterator[list[Agent]]:
    policy = write_policy(
        tmp_path / "policy.toml",
        [grant("bob", ["job.run", "job.steps", "job.chunks"]), grant("carol", ["job.run"])],
    )
    agents = await started_replicas(pki, tmp_path, pg_dsn, policy, gate.capabilities())
    yield agents
    for agent in agents:
        await agent.stop()


async def test_cancel_on_one_replica_cancels_the_task_running_on_the_other(
    pki: Pki, replicas: list[Agent], gate: TaskGate, pg_dsn: str
) -> None:
    one, two = replicas
    request = data_request("job.run", {"tag": "r"})
    request.configuration.return_immediately = True
    async with A2APeer(pki, one, "bob") as bob_one:
        task = await bob_one.send(request)
    await asyncio.wait_for(gate.started.wait(), 10)
    async with A2APeer(pki, two, "bob") as bob, A2APeer(pki, two, "carol") as carol:
        seen = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
        assert seen.status.state in (a2a_pb2.TASK_STATE_SUBMITTED, a2a_pb2.TASK_STATE_WORKING)
        with pytest.raises(a2a_errors.TaskNotFoundError):
            await carol.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
        canceled = await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
    assert gate.cancelled.is_set()
    for agent in replicas:
        await agent.audit.flush()
    ran = [
        r
        for r in query_records(
            open_audit_reader(location(pg_dsn)), AuditFilter(agent=one.config.id)
        )
        if r.capability
    ]
    assert [(r.reason, r.detail) for r in ran] == [
        ("CANCELLED", f"A2A CancelTask by {spiffe('bob')}")
    ]
    # The replica that answered never took the live task for an orphan.
    assert two.a2a_runs.running(task.id) is None


def _kinds(events: list[a2a_pb2.StreamResponse]) -> list[tuple[str, int]]:
    """(payload kind, task state) of each event (state 0 for an artifact update)."""
    kinds = []
    for event in events:
        kind = event.WhichOneof("payload")
        state = {
            "task": event.task.status.state,
            "status_update": event.status_update.status.state,
        }.get(kind, 0)
        kinds.append((kind, state))
    return kinds


async def _rest(stream: grpc.aio.UnaryStreamCall) -> list[a2a_pb2.StreamResponse]:  # type: ignore[type-arg]
    """The stream's remaining events, read to its end (raises its error, if any)."""
    events = []
    while (event := await stream.read()) is not grpc.aio.EOF:
        events.append(event)
    return events


async def _started_elsewhere(
    pki: Pki,
    agent: Agent,
    gate: TaskGate,
    tag: str,
    capability: str = "job.run",
    progress: str = "halfway",
) -> a2a_pb2.Task:
    request = data_request(capability, {"tag": tag})
    request.configuration.return_immediately = True
    async with A2APeer(pki, agent, "bob") as bob:
        task = await bob.send(request)
    await asyncio.wait_for(gate.started.wait(), 10)
    await _stored(agent, task.id, progress)
    return task


async def _stored(agent: Agent, task_id: str, progress: str) -> None:
    """Wait until the task's row says WORKING with ``progress`` (saved in the background)."""
    for _ in range(200):
        stored = await agent.a2a_tasks.get(spiffe("bob"), task_id)
        if stored is not None and (stored.state, stored.message) == (
            TaskOutcome.WORKING,
            progress,
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the task's WORKING state with {progress!r} was never saved")


async def test_subscribe_on_one_replica_follows_the_task_running_on_the_other(
    pki: Pki, replicas: list[Agent], gate: TaskGate
) -> None:
    one, two = replicas
    task = await _started_elsewhere(pki, one, gate, "followed")
    async with A2APeer(pki, two, "bob") as bob, A2APeer(pki, two, "carol") as carol:
        refused = carol.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=10
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in refused:
                pass
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        assert ("a2agw.v1", "TASK_NOT_FOUND") in error_infos(info.value)

        stream = bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=30
        )
        events = [await stream.read()]
        assert two.limit_stats().in_flight_total == 1  # the open subscription holds its place
        assert two.a2a_runs.running(task.id) is None  # followed from the table, not run here
        gate.release.set()
        events += await _rest(stream)
    assert _kinds(events) == [
        ("task", a2a_pb2.TASK_STATE_WORKING),
        ("artifact_update", 0),
        ("status_update", a2a_pb2.TASK_STATE_COMPLETED),
    ]
    assert events[0].task.id == task.id
    output = events[1].artifact_update.artifact
    assert output.artifact_id == f"{task.id}-output"
    assert dict(output.parts[0].data.struct_value) == {"done": "followed"}
    assert await stream.code() is grpc.StatusCode.OK
    assert two.limit_stats().in_flight_total == 0
    assert gate.runs == 1


async def test_a_follower_on_the_other_replica_sees_each_progress_text(
    pki: Pki, replicas: list[Agent], gate: TaskGate
) -> None:
    one, two = replicas
    task = await _started_elsewhere(pki, one, gate, "stepped", "job.steps", "step 1")
    async with A2APeer(pki, two, "bob") as bob:
        stream = bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=30
        )
        events = [await stream.read()]
        gate.next_step.set()  # the capability reports "step 2" on replica one
        await _stored(one, task.id, "step 2")
        events.append(await stream.read())
        gate.release.set()
        events += await _rest(stream)
    assert _kinds(events) == [
        ("task", a2a_pb2.TASK_STATE_WORKING),
        ("status_update", a2a_pb2.TASK_STATE_WORKING),
        ("artifact_update", 0),
        ("status_update", a2a_pb2.TASK_STATE_COMPLETED),
    ]
    assert events[0].task.status.message.parts[0].text == "step 1"
    assert events[1].status_update.status.message.parts[0].text == "step 2"
    assert dict(events[2].artifact_update.artifact.parts[0].data.struct_value) == {
        "done": "stepped"
    }
    assert await stream.code() is grpc.StatusCode.OK
    assert two.a2a_runs.running(task.id) is None
    assert gate.runs == 1


async def test_a_follower_on_the_other_replica_gets_the_chunks_emitted_after_it_began(
    pki: Pki, replicas: list[Agent], gate: TaskGate
) -> None:
    one, two = replicas
    request = data_request("job.chunks", {"tag": "chunked"})
    request.configuration.return_immediately = True
    async with A2APeer(pki, one, "bob") as bob:
        task = await bob.send(request)
    await asyncio.wait_for(gate.started.wait(), 10)
    await _until_kept(one, task.id, 1)  # part 1, emitted before the follow begins
    async with A2APeer(pki, two, "bob") as bob:
        stream = bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=30
        )
        events = [await stream.read()]
        gate.next_step.set()  # parts 2 and 3, on replica one
        events += [await stream.read(), await stream.read()]
        assert await two.a2a_tasks.chunks_from(spiffe("carol"), task.id, 0) == ()
        gate.release.set()
        events += await _rest(stream)
    assert _kinds(events) == [
        ("task", a2a_pb2.TASK_STATE_WORKING),
        ("artifact_update", 0),
        ("artifact_update", 0),
        ("artifact_update", 0),
        ("status_update", a2a_pb2.TASK_STATE_COMPLETED),
    ]
    chunks = [event.artifact_update for event in events[1:3]]
    assert [
        (
            c.artifact.artifact_id,
            c.append,
            c.last_chunk,
            dict(c.artifact.parts[0].data.struct_value),
        )
        for c in chunks
    ] == [
        (f"{task.id}-chunks", True, False, {"part": 2}),
        (f"{task.id}-chunks", True, False, {"part": 3}),
    ]
    output = events[3].artifact_update
    assert (output.artifact.artifact_id, output.last_chunk) == (f"{task.id}-output", True)
    assert await stream.code() is grpc.StatusCode.OK
    assert two.a2a_runs.running(task.id) is None
    await _until_kept(one, task.id, 0)  # dropped once the end is saved
    assert gate.runs == 1


async def _until_kept(agent: Agent, task_id: str, count: int) -> None:
    for _ in range(200):
        if await agent.a2a_tasks.chunk_count(spiffe("bob"), task_id) == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the task's kept chunks never numbered {count}")


async def test_a_follow_ends_with_agent_stopping_when_its_replica_stops(
    pki: Pki, replicas: list[Agent], gate: TaskGate
) -> None:
    one, two = replicas
    task = await _started_elsewhere(pki, one, gate, "stopping")
    async with A2APeer(pki, two, "bob") as bob:
        stream = bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=30
        )
        first = await stream.read()
        assert first.task.status.state == a2a_pb2.TASK_STATE_WORKING
        await two.stop()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _rest(stream)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error_infos(info.value) == [("a2agw.v1", "AGENT_STOPPING")]
    assert info.value.details() == task_follow.STOPPING
    # The task runs on where it was started.
    assert one.a2a_runs.running(task.id) is not None
    assert not gate.cancelled.is_set()
    gate.release.set()


async def test_a_follow_of_a_task_that_never_changes_ends_past_its_timeout_and_lease(
    pki: Pki, replicas: list[Agent], pg_dsn: str
) -> None:
    """A row a live-looking process never ends: the follow stops with DEADLINE_EXCEEDED."""
    one, two = replicas
    now_ms = int(time.time() * 1000)
    # Created so that its timeout (0.2 s), 1 s and the lease sweep pass a second from now.
    created_ms = now_ms - int((0.2 + 1.0 + task_follow.SWEEP_SECONDS) * 1000) + 1000
    stuck = a2a_task("stuck-1", spiffe("bob"), "job.brief", created_ms=created_ms)
    await one.a2a_tasks.save(stuck, "a-process-that-hangs", now_ms + 600_000)
    async with A2APeer(pki, two, "bob") as bob:
        stream = bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id="stuck-1"), metadata=V1, timeout=30
        )
        first = await stream.read()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _rest(stream)
    assert first.task.id == "stuck-1"
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert ("a2agw.v1", "DEADLINE_EXCEEDED") in error_infos(info.value)
    assert "contract timeout" in (info.value.details() or "")
    await two.audit.flush()
    records = query_records(open_audit_reader(location(pg_dsn)), AuditFilter(agent=two.config.id))
    ended = [r for r in records if r.reason == "DEADLINE_EXCEEDED"]
    assert [(r.decision, r.detail, r.peer_id) for r in ended] == [
        ("refuse", "A2A SubscribeToTask", spiffe("bob"))
    ]
    assert two.limit_stats().in_flight_total == 0
    # Following never writes: the row is as it was.
    assert await two.a2a_tasks.get(spiffe("bob"), "stuck-1") == stuck
