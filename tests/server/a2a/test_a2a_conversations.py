"""A2A conversations: ctx.ask_input, follow-up messages on a task, history, streams.

Real agents on 127.0.0.1 with mTLS and the a2a-sdk gRPC client. Every
follow-up passes the whole decision order and is audited once; the capability
sees only the answers that passed it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format

from capabilities import Answer, TextPart
from gateway.inbound.invoke_handler import FOLLOW_UP
from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversations import ask_trip, message, records, start_alice, texts
from tests.helpers.a2a_grpc import V1, A2APeer, gateway_reason, sdk_client
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations, Destination
from tests.helpers.task_capabilities import TaskGate

BOB = spiffe("bob")


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def alice(
    pki: Pki, tmp_path: Path, conversations: Conversations, gate: TaskGate
) -> AsyncIterator[Agent]:
    agent = await start_alice(pki, tmp_path, conversations, gate)
    yield agent
    await agent.stop()


# --- the conversation ---------------------------------------------------------------


async def test_a_task_asks_for_input_and_the_owners_answer_completes_it(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)
    assert texts(task.status.message) == ["Where to?"]
    assert task.status.message.role == a2a_pb2.ROLE_AGENT
    assert task.status.message.task_id == task.id and task.context_id
    done = await bob.send(
        message(data={"city": "Paris", "nights": 2}, task_id=task.id, message_id="answer-1")
    )
    assert (done.id, done.context_id) == (task.id, task.context_id)
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert texts(done.status.message) == ["done"]
    [artifact] = done.artifacts
    assert artifact.name == "booking" and texts(artifact) == ["booked Paris"]
    assert json_format.MessageToDict(artifact.parts[1].data) == {"nights": 2.0}
    assert conversations.seen == [
        ("trip.book", "a weekend away"),
        ("trip.book answer", Destination(city="Paris", nights=2)),  # integers restored
    ]
    kept = [(m.role, texts(m)) for m in done.history]
    assert kept == [
        (a2a_pb2.ROLE_USER, ["a weekend away"]),
        (a2a_pb2.ROLE_AGENT, ["Where to?"]),
        (a2a_pb2.ROLE_USER, []),  # the answer's data part
        (a2a_pb2.ROLE_AGENT, ["done"]),
    ]
    assert done.history[2].message_id == "answer-1"
    rows = [r for r in await records(alice) if r.task_id == task.id]
    assert [(r.request_id, r.decision, r.reason, r.detail) for r in rows] == [
        ("answer-1", "allow", "OK", FOLLOW_UP),  # the follow-up's decision
        (rows[1].request_id, "allow", "OK", ""),  # the run, once, when it ended
    ]
    assert rows[0].capability == "trip.book" and rows[0].served_version == "1.0.0"


async def test_a_refused_answer_leaves_the_task_waiting(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)
    with pytest.raises(a2a_errors.A2AError) as info:
        await bob.send(message(data={"town": "Paris"}, task_id=task.id))
    assert gateway_reason(info.value) == "INVALID_INPUT"
    with pytest.raises(a2a_errors.A2AError) as info:  # no data part: {} is no Destination
        await bob.send(message(text="Paris", task_id=task.id))
    assert gateway_reason(info.value) == "INVALID_INPUT"
    still = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert still.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    assert len(conversations.seen) == 1
    done = await bob.send(message(data={"city": "Oslo"}, task_id=task.id))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    rows = [r for r in await records(alice) if r.task_id == task.id]
    assert [(r.decision, r.reason) for r in rows] == [
        ("refuse", "INVALID_INPUT"),
        ("refuse", "INVALID_INPUT"),
        ("allow", "OK"),
        ("allow", "OK"),
    ]


async def test_only_the_owner_continues_its_task_and_a_foreign_id_is_not_found(
    pki: Pki, alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)
    answers = []
    async with A2APeer(pki, alice, "carol") as carol:
        for task_id in (task.id, "no-such-task"):
            with pytest.raises(a2a_errors.TaskNotFoundError) as info:
                await carol.send(message(data={"city": "Rome"}, task_id=task_id))
            rpc = info.value.__cause__
            assert isinstance(rpc, grpc.aio.AioRpcError)
            answers.append((rpc.code(), rpc.details()))
    assert answers[0] == answers[1] == (grpc.StatusCode.NOT_FOUND, "task not found")
    assert len(conversations.seen) == 1  # carol's answer never reached the capability
    rows = (await records(alice))[-2:]
    assert [(r.peer_id, r.decision, r.reason) for r in rows] == [
        (spiffe("carol"), "refuse", "TASK_NOT_FOUND")
    ] * 2
    assert (await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))).status.state == (
        a2a_pb2.TASK_STATE_INPUT_REQUIRED
    )


async def test_a_finished_or_working_task_takes_no_message(
    alice: Agent, bob: A2APeer, gate: TaskGate
) -> None:
    finished = await bob.send(message("chat.either", text="task"))
    assert finished.status.state == a2a_pb2.TASK_STATE_COMPLETED
    with pytest.raises(a2a_errors.UnsupportedOperationError):
        await bob.send(message(text="more", task_id=finished.id))
    background = message("job.run", data={"tag": "w"})
    background.configuration.return_immediately = True
    working = await bob.send(background)
    await asyncio.wait_for(gate.started.wait(), 10)
    with pytest.raises(a2a_errors.UnsupportedOperationError) as info:
        await bob.send(message(data={"tag": "x"}, task_id=working.id))
    assert "does not wait for input" in str(info.value)
    gate.release.set()
    assert [r.reason for r in (await records(alice)) if r.decision == "refuse"] == [
        "UNSUPPORTED_OPERATION"
    ] * 2


async def test_the_context_is_the_tasks_and_another_is_refused(alice: Agent, bob: A2APeer) -> None:
    task = await ask_trip(bob)
    with pytest.raises(a2a_errors.InvalidRequestError) as info:
        await bob.send(message(data={"city": "Rome"}, task_id=task.id, context_id="other"))
    assert "context_id differs" in str(info.value)
    done = await bob.send(
        message(data={"city": "Rome"}, task_id=task.id, context_id=task.context_id)
    )
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED


async def test_a_follow_up_names_only_the_tasks_capability_and_no_idempotency_key(
    alice: Agent, bob: A2APeer
) -> None:
    task = await ask_trip(bob)
    for capability, problem in (("chat.reply", "task's capability"), ("trip.book@2", "version")):
        with pytest.raises(a2a_errors.InvalidRequestError) as info:
            await bob.send(message(capability, data={"city": "Rome"}, task_id=task.id))
        assert problem in str(info.value)
    keyed = message(data={"city": "Rome"}, task_id=task.id)
    keyed.message.metadata["a2agw.idempotency_key"] = "k-1"
    with pytest.raises(a2a_errors.InvalidRequestError):
        await bob.send(keyed)
    done = await bob.send(message("trip.book@^1", data={"city": "Rome"}, task_id=task.id))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED


async def test_a_replayed_answer_is_refused_and_the_task_keeps_waiting(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)
    first = await bob.send(message("chat.loop", text="one"))
    await bob.send(message(text="two", task_id=first.id, message_id="m-2"))
    with pytest.raises(a2a_errors.A2AError) as info:
        await bob.send(message(data={"city": "Rome"}, task_id=task.id, message_id="m-2"))
    assert gateway_reason(info.value) == "REPLAYED_REQUEST"
    still = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert still.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED


async def test_a_waiting_task_counts_against_max_in_flight_but_its_answer_does_not(
    pki: Pki, tmp_path: Path, conversations: Conversations
) -> None:
    policy = write_policy(
        tmp_path / "policy.toml", [{**grant("bob", CAPABILITIES), "max_in_flight": 1}]
    )
    registry = standard_registry(WriteCounter(), tmp_path / "state")
    for cap in conversations.capabilities():
        registry.register(cap)
    alice = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            task = await ask_trip(bob)
            with pytest.raises(a2a_errors.A2AError) as info:
                await bob.send(message("chat.reply", text="x"))
            assert gateway_reason(info.value) == "CONCURRENCY_LIMITED"
            done = await bob.send(message(data={"city": "Rome"}, task_id=task.id))
            assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    finally:
        await alice.stop()


# --- answers without a schema, several turns, history ---------------------------------


async def test_several_turns_keep_the_history_and_history_length_cuts_it(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await bob.send(message("chat.loop", text="one", context_id="ctx-1", message_id="t-1"))
    assert task.context_id == "ctx-1" and texts(task.status.message) == ["got 1; more?"]
    second = await bob.send(message(text="two", task_id=task.id, message_id="turn-2"))
    assert texts(second.status.message) == ["got 2; more?"]
    done = await bob.send(message(text="done", task_id=task.id))
    assert [texts(a) for a in done.artifacts] == [["one two"]]
    (_, (message_id, context_id, parts)) = conversations.seen[0]
    assert (message_id, context_id, parts) == ("t-1", "ctx-1", (TextPart("one"),))
    answer = conversations.seen[1][1]
    assert answer == Answer("turn-2", (TextPart("two"),))
    full = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert [texts(m) for m in full.history] == [
        ["one"], ["got 1; more?"], ["two"], ["got 2; more?"], ["done"]
    ]  # fmt: skip
    two = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id, history_length=2))
    assert [texts(m) for m in two.history] == [["got 2; more?"], ["done"]]
    none = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id, history_length=0))
    assert len(none.history) == 0
    listed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest(context_id="ctx-1"))
    assert [t.id for t in listed.tasks] == [task.id] and len(listed.tasks[0].history) == 5
    with pytest.raises(a2a_errors.InvalidRequestError):
        await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id, history_length=-1))


async def test_a_send_can_ask_for_no_history(alice: Agent, bob: A2APeer) -> None:
    task = await bob.send(message("chat.loop", text="one"))
    quiet = message(text="done", task_id=task.id)
    quiet.configuration.history_length = 0
    done = await bob.send(quiet)
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED and len(done.history) == 0
    negative = message("chat.loop", text="x")
    negative.configuration.history_length = -1
    with pytest.raises(a2a_errors.InvalidRequestError) as info:
        await bob.send(negative)
    assert "history_length must not be negative" in str(info.value)


async def test_a_context_is_the_callers_own(pki: Pki, alice: Agent, bob: A2APeer) -> None:
    mine = await bob.send(message("chat.loop", text="one", context_id="shared"))
    async with A2APeer(pki, alice, "carol") as carol:
        theirs = await carol.send(message("chat.loop", text="two", context_id="shared"))
        listed = await carol.client.list_tasks(a2a_pb2.ListTasksRequest(context_id="shared"))
        assert [t.id for t in listed.tasks] == [theirs.id]
        with pytest.raises(a2a_errors.TaskNotFoundError):
            await carol.send(message(text="x", task_id=mine.id, context_id="shared"))
    listed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest(context_id="shared"))
    assert [t.id for t in listed.tasks] == [mine.id]


# --- the timeout, cancel, restart ---------------------------------------------------------


async def test_cancel_ends_a_waiting_task(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)
    canceled = await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
    assert conversations.cancelled.is_set()
    with pytest.raises(a2a_errors.UnsupportedOperationError):
        await bob.send(message(data={"city": "Rome"}, task_id=task.id))


async def test_the_contract_timeout_holds_while_a_task_waits(pki: Pki, tmp_path: Path) -> None:
    conversations = Conversations()
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["trip.quick"])])
    registry = standard_registry(WriteCounter(), tmp_path / "state")
    [book] = [c for c in conversations.capabilities() if c.name == "trip.book"]
    from dataclasses import replace

    from capabilities.registry import Capability

    quick = replace(book.contract, name="trip.quick", timeout_seconds=0.5)
    registry.register(Capability(quick, book.handler))
    alice = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            task = await bob.send(message("trip.quick", text="x"))
            assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
            for _ in range(100):
                seen = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
                if seen.status.state == a2a_pb2.TASK_STATE_FAILED:
                    break
                await asyncio.sleep(0.05)
            assert seen.status.state == a2a_pb2.TASK_STATE_FAILED
            assert seen.metadata["a2agw.reason"] == "CAPABILITY_TIMEOUT"
    finally:
        await alice.stop()


async def test_a_task_waiting_when_its_agent_stopped_ends_interrupted(
    pki: Pki, tmp_path: Path, conversations: Conversations
) -> None:
    alice = await start_alice(pki, tmp_path, conversations)
    async with A2APeer(pki, alice, "bob") as bob:
        task = await ask_trip(bob)
    await alice.stop()
    again = await start_alice(pki, tmp_path, Conversations())
    try:
        async with A2APeer(pki, again, "bob") as bob:
            seen = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            assert seen.status.state == a2a_pb2.TASK_STATE_FAILED
            assert seen.metadata["a2agw.reason"] == "TASK_INTERRUPTED"
            with pytest.raises(a2a_errors.UnsupportedOperationError):
                await bob.send(message(data={"city": "Rome"}, task_id=task.id))
    finally:
        await again.stop()


# --- streams --------------------------------------------------------------------------


def summary(event: a2a_pb2.StreamResponse) -> str:
    kind = event.WhichOneof("payload")
    if kind == "task":
        return f"task:{_state(event.task.status.state)}"
    if kind == "message":
        return f"message:{texts(event.message)}"
    if kind == "status_update":
        status = event.status_update.status
        said = texts(status.message)
        return f"status:{_state(status.state)}" + (f":{said[0]}" if said else "")
    artifact = event.artifact_update.artifact
    return f"artifact:{[p.WhichOneof('content') for p in artifact.parts]}"


def _state(state: int) -> str:
    return a2a_pb2.TaskState.Name(state).removeprefix("TASK_STATE_")


async def test_a_stream_ends_when_the_task_asks_and_the_answer_streams_on(
    alice: Agent, bob: A2APeer
) -> None:
    first = [
        summary(event)
        async for event in bob.stub.SendStreamingMessage(
            message("trip.book", text="x"), metadata=V1, timeout=10
        )
    ]
    assert first == ["task:SUBMITTED", "status:WORKING", "status:INPUT_REQUIRED:Where to?"]
    task = await bob.client.list_tasks(a2a_pb2.ListTasksRequest())
    task_id = task.tasks[0].id
    second = [
        summary(event)
        async for event in bob.stub.SendStreamingMessage(
            message(data={"city": "Rome"}, task_id=task_id), metadata=V1, timeout=10
        )
    ]
    assert second == [
        "task:WORKING",
        "artifact:['text', 'data']",
        "status:COMPLETED:done",
    ]


async def test_a_subscription_follows_a_waiting_task_to_its_end(alice: Agent, bob: A2APeer) -> None:
    task = await ask_trip(bob)
    stream = bob.stub.SubscribeToTask(
        a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=10
    )
    seen = [summary(await stream.read())]
    await bob.send(message(data={"city": "Rome"}, task_id=task.id))
    while (event := await stream.read()) is not grpc.aio.EOF:
        seen.append(summary(event))
    assert seen == [
        "task:INPUT_REQUIRED",
        "status:WORKING",
        "artifact:['text', 'data']",
        "status:COMPLETED:done",
    ]


async def test_auth_required_is_answered_by_the_callers_follow_up(
    alice: Agent, bob: A2APeer
) -> None:
    task = await bob.send(message("auth.ask", text="pay"))
    assert task.status.state == a2a_pb2.TASK_STATE_AUTH_REQUIRED
    assert texts(task.status.message) == ["Authorize the transfer"]
    listed = await bob.client.list_tasks(
        a2a_pb2.ListTasksRequest(status=a2a_pb2.TASK_STATE_AUTH_REQUIRED)
    )
    assert [t.id for t in listed.tasks] == [task.id]
    done = await bob.send(message(text="yes", task_id=task.id))
    assert [texts(a) for a in done.artifacts] == [["authorized: yes"]]


async def test_asking_without_asks_input_in_the_contract_fails_the_call(
    alice: Agent, bob: A2APeer
) -> None:
    task = await bob.send(message("ask.undeclared", data={}))
    assert task.status.state == a2a_pb2.TASK_STATE_FAILED
    assert task.metadata["a2agw.reason"] == "CAPABILITY_FAILED"
    streaming = sdk_client(bob.channel, alice, streaming=True)
    events = [e async for e in streaming.send_message(message("ask.undeclared", data={}))]
    assert events[-1].status_update.status.state == a2a_pb2.TASK_STATE_FAILED


async def test_a_write_that_asks_records_its_answer_before_it_writes(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await bob.send(message("trip.write", text="x"))
    assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    done = await bob.send(message(data={"city": "Rome"}, task_id=task.id, message_id="w-2"))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED and conversations.writes == 1
    rows = [r for r in await records(alice) if r.task_id == task.id]
    assert [(r.decision, r.reason, r.request_id == "w-2") for r in rows] == [
        ("allow", "ADMITTED", False),
        ("allow", "OK", True),
        ("allow", "OK", False),
    ]
