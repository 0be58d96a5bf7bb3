"""Push notifications of conversations: the waiting states reach the webhook, and a
Message answer (no task kept) is the one thing delivered for a call answered that way.

alice (push on) serves the conversation capabilities; bob may name ``127.0.0.1``
in his webhooks. Each delivery is checked by the receiver's JWS verification.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.types import a2a_pb2

from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversations import message, records, texts
from tests.helpers.a2a_grpc import A2APeer, summary
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
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations
from tests.helpers.push_receiver import WebhookReceiver, attempts, pushed, webhook, with_push

ALICE, BOB = spiffe("alice"), spiffe("bob")


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(tmp_path / "webhook") as hook:
        yield hook


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, receiver: WebhookReceiver) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [{**grant("bob", CAPABILITIES), "push_hosts": ["127.0.0.1"]}],
    )
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in Conversations().capabilities():
        registry.register(cap)
    agent = await started(
        with_push(agent_config(pki, tmp_path, "alice", policy), receiver.ca), registry
    )
    yield agent
    await agent.stop()


@pytest.fixture
async def bob(pki: Pki, alice: Agent) -> AsyncIterator[A2APeer]:
    async with A2APeer(pki, alice, "bob") as peer:
        yield peer


async def test_input_required_and_the_answer_reach_the_webhook(
    alice: Agent, bob: A2APeer, pki: Pki, receiver: WebhookReceiver
) -> None:
    url = receiver.url()
    task = await bob.send(pushed(message("trip.book", text="away"), webhook(url)))
    assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    asked = await receiver.wait(2)
    assert [summary(d.event()) for d in asked] == [
        "status:WORKING",
        "status:INPUT_REQUIRED:Where to?",
    ]
    done = await bob.send(message(data={"city": "Oslo"}, task_id=task.id))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    got = await receiver.wait(5)
    assert [summary(d.event()) for d in got[2:]] == [
        "status:WORKING",  # the answer resumed it
        "artifact:output",
        "status:COMPLETED:done",
    ]
    ca = (pki.dir / "ca.pem").read_bytes()
    for delivered in got:
        delivered.verified(ca, ALICE, url)
        which = delivered.event().WhichOneof("payload")
        assert getattr(delivered.event(), which).task_id == task.id
    rows = await attempts(alice, 5)
    assert [(r.decision, r.reason, r.peer_id, r.task_id) for r in rows] == [
        ("allow", "OK", BOB, task.id)
    ] * 5


async def test_auth_required_reaches_the_webhook(
    alice: Agent, bob: A2APeer, receiver: WebhookReceiver
) -> None:
    task = await bob.send(pushed(message("auth.ask", text="pay"), webhook(receiver.url())))
    assert task.status.state == a2a_pb2.TASK_STATE_AUTH_REQUIRED
    assert texts(task.status.message) == ["Authorize the transfer"]
    got = await receiver.wait(2)
    assert [summary(d.event()) for d in got] == [
        "status:WORKING",
        "status:AUTH_REQUIRED:Authorize the transfer",
    ]
    # The caller's answer ends it, so no delivery is in flight when alice stops.
    done = await bob.send(message(text="yes", task_id=task.id))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    got = await receiver.wait(5)
    assert [summary(d.event()) for d in got[2:]] == [
        "status:WORKING",
        "artifact:output",
        "status:COMPLETED",
    ]
    await attempts(alice, 5)


async def test_a_message_answer_keeps_no_task_and_is_its_one_notification(
    alice: Agent, bob: A2APeer, pki: Pki, receiver: WebhookReceiver
) -> None:
    url = receiver.url()
    request = pushed(message("chat.reply", text="bob"), webhook(url))
    [answer] = [event async for event in bob.client.send_message(request)]
    assert answer.WhichOneof("payload") == "message"  # gives messages only: never a task
    assert texts(answer.message) == ["hello bob"]
    [delivered] = await receiver.wait(1)
    delivered.verified((pki.dir / "ca.pem").read_bytes(), ALICE, url)
    assert delivered.event().WhichOneof("payload") == "message"
    assert texts(delivered.event().message) == ["hello bob"]
    listed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest())
    assert list(listed.tasks) == []  # no task was kept
    await attempts(alice, 1)  # the delivery's record is in
    rows = await records(alice)
    calls = [(r.capability, r.decision, r.reason) for r in rows if r.capability]
    assert calls == [("chat.reply", "allow", "OK")]  # the config's record, the call's
    assert [r.detail.split(" config=")[0] for r in rows if not r.capability] == [
        "A2A SendMessage",
        "A2A push",
    ]
