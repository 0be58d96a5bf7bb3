"""Conversations across replicas: an answer reaching another replica than the one its task waits in.

Two agents share a PostgreSQL state database (replicas of one agent id). The
replica that gets the answer admits it (the whole decision order, against the
schema the task's row names), leaves it in the store, and the replica running
the task takes it (and audits it); the answer's own reply follows the task
through the store. One audit record per follow-up, written by the side that
decided.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.inbound.invoke_handler import FOLLOW_UP
from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversations import message, records, texts
from tests.helpers.a2a_grpc import V1, A2APeer, gateway_reason
from tests.helpers.agents import (
    Pki,
    grant,
    started_replicas,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations, Destination


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
async def replicas(
    pki: Pki, tmp_path: Path, pg_dsn: str, conversations: Conversations
) -> AsyncIterator[list[Agent]]:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", CAPABILITIES)])
    agents = await started_replicas(pki, tmp_path, pg_dsn, policy, conversations.capabilities())
    yield agents
    for agent in agents:
        await agent.stop()


async def test_an_answer_on_the_other_replica_completes_the_task(
    pki: Pki, replicas: list[Agent], conversations: Conversations
) -> None:
    one, two = replicas
    async with A2APeer(pki, one, "bob") as bob_one, A2APeer(pki, two, "bob") as bob_two:
        task = await bob_one.send(message("trip.book", text="away"))
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        with pytest.raises(a2a_errors.A2AError) as info:  # refused there, audited there
            await bob_two.send(message(data={"town": "Oslo"}, task_id=task.id))
        assert gateway_reason(info.value) == "INVALID_INPUT"
        done = await bob_two.send(message(data={"city": "Oslo"}, task_id=task.id, message_id="a-2"))
        assert (done.id, done.status.state) == (task.id, a2a_pb2.TASK_STATE_COMPLETED)
        assert [texts(a) for a in done.artifacts] == [["booked Oslo"]]
        assert [texts(m)[:1] for m in done.history] == [["away"], ["Where to?"], [], ["done"]]
    assert conversations.seen[-1] == ("trip.book answer", Destination(city="Oslo"))
    rows = [r for r in await records(one) if r.task_id == task.id]
    assert [(r.request_id == "a-2", r.decision, r.reason, r.detail) for r in rows] == [
        (False, "refuse", "INVALID_INPUT", rows[0].detail),
        (True, "allow", "OK", FOLLOW_UP),
        (False, "allow", "OK", ""),
    ]


async def test_a_streamed_answer_on_the_other_replica_follows_the_task(
    pki: Pki, replicas: list[Agent]
) -> None:
    one, two = replicas
    async with A2APeer(pki, one, "bob") as bob_one, A2APeer(pki, two, "bob") as bob_two:
        task = await bob_one.send(message("chat.loop", text="one"))
        events = [
            event
            async for event in bob_two.stub.SendStreamingMessage(
                message(text="two", task_id=task.id), metadata=V1, timeout=30
            )
        ]
        # The task (as the store shows it once the answer was taken), its changes, and the
        # next question last: a stream of one event when the other replica was that quick.
        assert events[0].HasField("task")
        last = events[-1].task.status if len(events) == 1 else events[-1].status_update.status
        assert last.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        assert texts(last.message) == ["got 2; more?"]
        immediately = message(text="done", task_id=task.id)
        immediately.configuration.return_immediately = True
        answered = await bob_two.send(immediately)
        assert answered.status.state in (a2a_pb2.TASK_STATE_WORKING, a2a_pb2.TASK_STATE_COMPLETED)
        for _ in range(200):
            seen = await bob_one.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            if seen.status.state == a2a_pb2.TASK_STATE_COMPLETED:
                break
        assert [texts(a) for a in seen.artifacts] == [["one two"]]


async def test_a_schema_no_other_replica_can_name_is_answered_only_where_it_waits(
    pki: Pki, replicas: list[Agent]
) -> None:
    one, two = replicas
    async with A2APeer(pki, one, "bob") as bob_one, A2APeer(pki, two, "bob") as bob_two:
        task = await bob_one.send(message("ask.local", data={}))
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        with pytest.raises(a2a_errors.UnsupportedOperationError) as info:
            await bob_two.send(message(data={"yes": True}, task_id=task.id))
        assert "in another process" in str(info.value)
        done = await bob_one.send(message(data={"yes": True}, task_id=task.id))
        assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
