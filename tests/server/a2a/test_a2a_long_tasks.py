"""Long-running A2A tasks: return_immediately, streams, subscriptions, cancel, shutdown.

Real agents on 127.0.0.1 with mTLS, the a2a-sdk gRPC client (streaming and
polling) and raw stubs; SQLite and PostgreSQL where the store matters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format

from gateway.audit import AuditRecord
from gateway.config import A2ASettings
from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import (
    V1,
    A2APeer,
    data_request,
    gateway_reason,
    output_of,
    poll_until,
    sdk_client,
    summary,
)
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    WriteCounter,
    audit_rows,
    spiffe,
    standard_registry,
    started,
)
from tests.helpers.task_agents import start_alice, task_grants
from tests.helpers.task_capabilities import TaskGate

BOB = spiffe("bob")


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def alice(make_agent: AgentFactory, gate: TaskGate) -> Agent:
    return await make_agent(grants=task_grants(), capabilities=gate.capabilities())


async def records(agent: Agent) -> list[AuditRecord]:
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


async def rest_of(stream: Any) -> list[a2a_pb2.StreamResponse]:
    """The events left on a stream already read with ``read()`` (no iterator mixing)."""
    events = []
    while (event := await stream.read()) is not grpc.aio.EOF:
        events.append(event)
    return events


def background(capability: str, payload: dict[str, Any]) -> a2a_pb2.SendMessageRequest:
    request = data_request(capability, payload)
    request.configuration.return_immediately = True
    return request


# --- streaming ----------------------------------------------------------------


async def test_a_stream_is_the_task_then_its_events_in_order_ending_terminal(
    pki: Pki, tmp_path: Path, gate: TaskGate, stores: dict[str, str]
) -> None:
    alice = await start_alice(pki, tmp_path, gate, stores=stores)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            client = sdk_client(bob.channel, alice, streaming=True)
            seen: list[a2a_pb2.StreamResponse] = []
            async for event in client.send_message(data_request("job.run", {"tag": "t1"})):
                seen.append(event)
                if summary(event) == "artifact:chunks":
                    gate.release.set()  # the work goes on only once the chunk has arrived
            assert [summary(e) for e in seen] == [
                "task:SUBMITTED",
                "status:WORKING",
                "status:WORKING:halfway",
                "artifact:chunks",
                "artifact:output",
                "status:COMPLETED",
            ]
            task_id = seen[0].task.id
            chunk = seen[3].artifact_update
            assert json_format.MessageToDict(chunk.artifact.parts[0].data) == {"part": 1}
            assert not chunk.append and not chunk.last_chunk
            final = seen[4].artifact_update
            assert final.last_chunk
            assert json_format.MessageToDict(final.artifact.parts[0].data) == {"done": "t1"}
            assert {e.status_update.task_id for e in seen[1:3] + seen[5:]} == {task_id}
            stored = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
            assert stored.status.state == a2a_pb2.TASK_STATE_COMPLETED
            assert output_of(stored) == {"done": "t1"}
        ran = [r for r in await records(alice) if r.capability == "job.run"]
        assert [(r.decision, r.reason, r.task_id) for r in ran] == [("allow", "OK", task_id)]
    finally:
        await alice.stop()


async def test_a_capability_that_reports_nothing_still_streams_its_states(
    alice: Agent, bob: A2APeer
) -> None:
    call = bob.stub.SendStreamingMessage(
        data_request("text.echo", {"text": "hi"}), metadata=V1, timeout=10
    )
    seen = [event async for event in call]
    assert [summary(e) for e in seen] == [
        "task:SUBMITTED",
        "status:WORKING",
        "artifact:output",
        "status:COMPLETED",
    ]
    assert json_format.MessageToDict(seen[2].artifact_update.artifact.parts[0].data) == {
        "text": "hi"
    }


async def test_a_refused_stream_is_one_grpc_error_and_one_record_and_runs_nothing(
    alice: Agent, carol: A2APeer, gate: TaskGate
) -> None:
    before = len(await records(alice))
    call = carol.stub.SendStreamingMessage(
        data_request("job.run", {"tag": "x", "extra": 1}), metadata=V1, timeout=10
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert gateway_reason(info.value) == "INVALID_INPUT"
    new = (await records(alice))[before:]
    assert [(r.decision, r.reason, r.peer_id) for r in new] == [
        ("refuse", "INVALID_INPUT", spiffe("carol"))
    ]
    assert gate.runs == 0
    listed = await carol.client.list_tasks(a2a_pb2.ListTasksRequest())
    assert listed.total_size == 0


async def test_chunks_over_the_callers_cap_fail_the_task_with_its_reason(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    call = bob.stub.SendStreamingMessage(
        data_request("job.flood", {"tag": "x"}), metadata=V1, timeout=10
    )
    seen = [event async for event in call]
    kinds = [summary(e) for e in seen]
    assert kinds[:2] == ["task:SUBMITTED", "status:WORKING"]
    assert set(kinds[2:-1]) == {"artifact:chunks"} and kinds[-1].startswith("status:FAILED:")
    assert 4 <= len(kinds[2:-1]) <= 7  # 10 KB chunks under bob's 64 KiB cap
    status = seen[-1].status_update.status
    assert status.message.metadata["a2agw.reason"] == "CAPABILITY_FAILED"
    # Its own chunks, not an answer it was given (an attack round found "a call it
    # made was answered OUTPUT_TOO_LARGE" for a capability that made no call).
    assert status.message.parts[0].text == (
        "job.flood@1.0.0 failed: its output chunks exceed the caller's cap"
    )
    ran = [r for r in await records(alice) if r.capability == "job.flood"]
    assert [(r.reason, r.detail) for r in ran] == [("CAPABILITY_FAILED", "OUTPUT_TOO_LARGE")]


# --- return_immediately and polling -------------------------------------------


async def test_return_immediately_answers_at_once_then_get_task_sees_it_finish(
    pki: Pki, tmp_path: Path, gate: TaskGate, stores: dict[str, str]
) -> None:
    alice = await start_alice(pki, tmp_path, gate, stores=stores)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            polling = sdk_client(bob.channel, alice, polling=True)
            [event] = [e async for e in polling.send_message(data_request("job.run", {"tag": "p"}))]
            task = event.task
            assert task.status.state == a2a_pb2.TASK_STATE_SUBMITTED
            await asyncio.wait_for(gate.started.wait(), 10)
            working = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            assert working.status.state == a2a_pb2.TASK_STATE_WORKING
            assert working.status.message.parts[0].text == "halfway"
            assert len(alice.a2a_runs) == 1  # what a2agw_a2a_tasks_running shows
            listed = await bob.client.list_tasks(
                a2a_pb2.ListTasksRequest(status=a2a_pb2.TASK_STATE_WORKING)
            )
            assert [t.id for t in listed.tasks] == [task.id]
            gate.release.set()
            done = await poll_until(bob, task.id, a2a_pb2.TASK_STATE_COMPLETED)
            assert output_of(done) == {"done": "p"}
            assert done.metadata["a2agw.served_version"] == "1.0.0"
            for _ in range(200):  # bounded: the run is let go once its end is saved
                if len(alice.a2a_runs) == 0:
                    break
                await asyncio.sleep(0.05)
            assert len(alice.a2a_runs) == 0
        ran = [r for r in await records(alice) if r.capability == "job.run"]
        assert [(r.decision, r.reason) for r in ran] == [("allow", "OK")]
    finally:
        await alice.stop()


async def test_a_background_run_outlives_its_rpc_deadline_but_not_its_contract_timeout(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    answer = await bob.stub.SendMessage(
        background("job.run", {"tag": "late"}), metadata=V1, timeout=1.0
    )
    await asyncio.wait_for(gate.started.wait(), 10)
    await asyncio.sleep(1.2)  # the SendMessage's own deadline has passed
    gate.release.set()
    done = await poll_until(bob, answer.task.id, a2a_pb2.TASK_STATE_COMPLETED)
    assert output_of(done) == {"done": "late"}

    gate.release.clear()
    brief = await bob.send(background("job.brief", {"tag": "slow"}))
    failed = await poll_until(bob, brief.id, a2a_pb2.TASK_STATE_FAILED)
    assert failed.metadata["a2agw.reason"] == "CAPABILITY_TIMEOUT"
    assert gate.cancelled.is_set()
    ran = [r for r in await records(alice) if r.capability == "job.brief"]
    assert [(r.decision, r.reason) for r in ran] == [("allow", "CAPABILITY_TIMEOUT")]


async def test_an_idempotent_replay_in_the_background_does_not_write_twice(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    gate.release.set()
    answers = []
    for _ in range(2):
        request = background("job.write", {"tag": "w"})
        request.message.metadata["a2agw.idempotency_key"] = "key-1"
        answers.append((await bob.send(request)).id)
        await poll_until(bob, answers[-1], a2a_pb2.TASK_STATE_COMPLETED)
    assert gate.writes == 1
    second = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=answers[1]))
    assert second.artifacts[0].metadata["a2agw.replayed"] is True


# --- cancel ---------------------------------------------------------------------


async def test_cancel_stops_the_capability_and_is_audited_with_the_canceller(
    alice: Agent, bob: A2APeer, carol: A2APeer, gate: TaskGate
) -> None:
    task = await bob.send(background("job.run", {"tag": "c"}))
    await asyncio.wait_for(gate.started.wait(), 10)

    with pytest.raises(a2a_errors.TaskNotFoundError):  # not carol's: as if it did not exist
        await carol.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    refused = (await records(alice))[-1]
    assert (refused.peer_id, refused.reason) == (spiffe("carol"), "TASK_NOT_FOUND")
    assert not gate.cancelled.is_set()

    canceled = await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
    assert canceled.status.message.metadata["a2agw.reason"] == "CANCELLED"
    assert gate.cancelled.is_set()  # the capability saw its CancelledError
    again = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert again.status.state == a2a_pb2.TASK_STATE_CANCELED
    ran = [r for r in await records(alice) if r.capability == "job.run"]
    assert [(r.decision, r.reason, r.peer_id, r.task_id) for r in ran] == [
        ("allow", "CANCELLED", BOB, task.id)
    ]
    assert ran[0].detail == f"A2A CancelTask by {BOB}"

    with pytest.raises(a2a_errors.TaskNotCancelableError):
        await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    last = (await records(alice))[-1]
    assert (last.reason, last.task_id, last.detail) == (
        "TASK_NOT_CANCELABLE",
        task.id,
        "A2A CancelTask",
    )


async def test_a_canceled_write_is_recorded_as_one_that_may_have_run(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    task = await bob.send(background("job.write", {"tag": "w"}))
    await asyncio.wait_for(gate.started.wait(), 10)
    canceled = await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
    assert "a write capability may have run" in canceled.status.message.parts[0].text
    assert gate.writes == 1 and gate.cancelled.is_set()
    ran = [r for r in await records(alice) if r.capability == "job.write"]
    assert [(r.reason, r.detail) for r in ran] == [
        ("ADMITTED", ""),
        ("CANCELLED", f"A2A CancelTask by {BOB}; a write capability may have run"),
    ]


async def test_a_subscriber_follows_a_running_task_to_its_end(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    task = await bob.send(background("job.run", {"tag": "s"}))
    await asyncio.wait_for(gate.started.wait(), 10)
    client = sdk_client(bob.channel, alice, streaming=True)
    seen = []
    async for event in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=task.id)):
        seen.append(summary(event))
        if len(seen) == 1:
            gate.release.set()
    assert seen == ["task:WORKING", "artifact:output", "status:COMPLETED"]

    # Once finished there is nothing to follow; another peer's task does not exist.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=10
        ):
            pass
    assert gateway_reason(info.value) == "UNSUPPORTED_OPERATION"
    record = (await records(alice))[-1]
    assert (record.reason, record.task_id, record.detail) == (
        "UNSUPPORTED_OPERATION",
        task.id,
        "A2A SubscribeToTask",
    )


# --- limits -------------------------------------------------------------------


async def test_background_tasks_and_open_streams_count_against_max_in_flight(
    pki: Pki, tmp_path: Path, gate: TaskGate
) -> None:
    alice = await start_alice(pki, tmp_path, gate, bob={"max_in_flight": 1})
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            task = await bob.send(background("job.run", {"tag": "1"}))
            await asyncio.wait_for(gate.started.wait(), 10)
            with pytest.raises(a2a_errors.A2AError) as info:
                await bob.send(data_request("text.echo", {"text": "2"}))
            assert gateway_reason(info.value) == "CONCURRENCY_LIMITED"
            # Polling its own task is not a call in flight.
            polled = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            assert polled.status.state == a2a_pb2.TASK_STATE_WORKING
            # A subscription is one: refused while the task holds bob's one place.
            with pytest.raises(grpc.aio.AioRpcError) as sub:
                async for _ in bob.stub.SubscribeToTask(
                    a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=10
                ):
                    pass
            assert gateway_reason(sub.value) == "CONCURRENCY_LIMITED"
            gate.release.set()
            await poll_until(bob, task.id, a2a_pb2.TASK_STATE_COMPLETED)

            gate.release.clear()
            gate.started.clear()
            stream = bob.stub.SendStreamingMessage(
                data_request("job.run", {"tag": "3"}), metadata=V1, timeout=20
            )
            first = await stream.read()
            assert summary(first) == "task:SUBMITTED"
            await asyncio.wait_for(gate.started.wait(), 10)
            with pytest.raises(a2a_errors.A2AError) as info:
                await bob.send(data_request("text.echo", {"text": "4"}))
            assert gateway_reason(info.value) == "CONCURRENCY_LIMITED"
            gate.release.set()
            rest = [summary(e) for e in await rest_of(stream)]
            assert rest[-1] == "status:COMPLETED"
            assert (await bob.send(data_request("text.echo", {"text": "5"}))).status.state == (
                a2a_pb2.TASK_STATE_COMPLETED
            )
        refusals = [r for r in await records(alice) if r.reason == "CONCURRENCY_LIMITED"]
        assert refusals and all(r.peer_id == BOB for r in refusals)
    finally:
        await alice.stop()


async def test_polling_is_rate_limited_like_calls(pki: Pki, tmp_path: Path, gate: TaskGate) -> None:
    alice = await start_alice(pki, tmp_path, gate, bob={"max_calls_per_second": 0.01, "burst": 2})
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            task = await bob.send(data_request("text.echo", {"text": "x"}))  # token 1
            await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))  # token 2
            for method, request in (
                (bob.stub.GetTask, a2a_pb2.GetTaskRequest(id=task.id)),
                (bob.stub.ListTasks, a2a_pb2.ListTasksRequest()),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await method(request, metadata=V1, timeout=10)
                assert gateway_reason(info.value) == "RATE_LIMITED"
    finally:
        await alice.stop()


# --- shutdown and restart -----------------------------------------------------


async def test_shutdown_ends_streams_cleanly_and_the_task_stays_failed_after_restart(
    pki: Pki, tmp_path: Path, gate: TaskGate, stores: dict[str, str]
) -> None:
    alice = await start_alice(pki, tmp_path, gate, stores=stores)
    stopped = False
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            stream = bob.stub.SendStreamingMessage(
                data_request("job.run", {"tag": "z"}), metadata=V1, timeout=20
            )
            first = await stream.read()
            task_id = first.task.id
            await asyncio.wait_for(gate.started.wait(), 10)
            stopping = asyncio.create_task(alice.stop())
            rest = await rest_of(stream)  # ends without an error
            await stopping
            stopped = True
            assert gate.cancelled.is_set()
            assert summary(rest[-1]).startswith("status:FAILED:the agent stopped")
            status = rest[-1].status_update.status
            assert status.message.metadata["a2agw.reason"] == "TASK_INTERRUPTED"
            assert await stream.code() is grpc.StatusCode.OK
    finally:
        if not stopped:
            await alice.stop()
    alice = await start_alice(pki, tmp_path, TaskGate(), stores=stores)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            again = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
            assert again.status.state == a2a_pb2.TASK_STATE_FAILED
            assert again.metadata["a2agw.reason"] == "TASK_INTERRUPTED"
    finally:
        await alice.stop()


async def test_a_stream_asked_for_while_the_agent_stops_is_refused_once(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    await alice.a2a_runs.shutdown()  # what Agent.stop does first
    before = len(await records(alice))
    call = bob.stub.SendStreamingMessage(data_request("job.run", {}), metadata=V1, timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert gateway_reason(info.value) == "AGENT_STOPPING"
    new = (await records(alice))[before:]
    assert [(r.decision, r.reason, r.detail) for r in new] == [
        ("refuse", "AGENT_STOPPING", "A2A SendStreamingMessage")
    ]
    assert gate.runs == 0 and alice.limit_stats().in_flight_total == 0


async def test_finished_tasks_past_the_retention_are_deleted_at_start(
    pki: Pki, tmp_path: Path, gate: TaskGate, stores: dict[str, str]
) -> None:
    alice = await start_alice(pki, tmp_path, gate, stores=stores)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            old = await bob.send(data_request("text.echo", {"text": "old"}))
            interrupted = await bob.send(background("job.run", {"tag": "still running"}))
            await asyncio.wait_for(gate.started.wait(), 10)
    finally:
        await alice.stop()  # the running one ends FAILED (TASK_INTERRUPTED) now
    await asyncio.sleep(1.1)
    config = alice.config.model_copy(update={"a2a": A2ASettings(task_retention="1s")})
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    again = await started(config, registry)
    try:
        async with A2APeer(pki, again, "bob") as bob:
            for task_id in (old.id, interrupted.id):
                with pytest.raises(a2a_errors.TaskNotFoundError):
                    await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
            fresh = await bob.send(data_request("text.echo", {"text": "new"}))
            assert (await bob.client.get_task(a2a_pb2.GetTaskRequest(id=fresh.id))).id == fresh.id
    finally:
        await again.stop()


async def test_a_subscription_ends_cleanly_when_the_agent_stops(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    task = await bob.send(background("job.run", {"tag": "sub"}))
    await asyncio.wait_for(gate.started.wait(), 10)
    stream = bob.stub.SubscribeToTask(
        a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=20
    )
    assert summary(await stream.read()) == "task:WORKING"
    assert alice.limit_stats().in_flight.get(BOB) == 2  # the task and the subscription
    await alice.a2a_runs.shutdown()  # what Agent.stop does first
    rest = await rest_of(stream)
    assert summary(rest[-1]).startswith("status:FAILED:the agent stopped")
    assert await stream.code() is grpc.StatusCode.OK
    assert alice.limit_stats().in_flight.get(BOB) is None  # both places given back


async def test_a_burst_of_progress_texts_costs_the_row_a_save_or_two_and_ends_completed(
    pki: Pki, alice: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The running process saves a task's latest progress text for followers in
    # other processes, one save at a time and at most every PROGRESS_SAVE_SECONDS:
    # 500 texts reported in one turn of the loop are one or two writes, not 500.
    store = alice.a2a_tasks
    saved: list[tuple[str, str]] = []
    save = store.save

    async def counted(task: Any, *args: Any, **kwargs: Any) -> bool:
        saved.append((task.state.value, task.message))
        return await save(task, *args, **kwargs)

    monkeypatch.setattr(store, "save", counted)
    request = data_request("job.chatty", {"tag": "burst"})
    request.configuration.return_immediately = True
    async with A2APeer(pki, alice, "bob") as bob:
        task = await bob.send(request)
        for _ in range(200):
            seen = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            if seen.status.state == a2a_pb2.TASK_STATE_COMPLETED:
                break
            await asyncio.sleep(0.05)
    assert seen.status.state == a2a_pb2.TASK_STATE_COMPLETED
    working = [message for state, message in saved if state == "working"]
    assert 1 <= len(working) <= 2 and working[-1] == "500/500", saved
    assert saved[0] == ("submitted", "") and saved[-1] == ("completed", "")
    stored = await store.get(BOB, task.id)
    assert stored is not None and stored.state.value == "completed"
