"""A2A push notifications end to end: the a2a-sdk client sets webhooks, a receiver checks them.

alice runs on 127.0.0.1 with ``[push]`` on; bob (the a2a-sdk gRPC client, his
own certificate) may name ``127.0.0.1`` and ``receiver.test`` in his webhooks,
carol none. The webhook is a real HTTPS server with its own CA, which alice
trusts through ``[push] ca``; it verifies each notification's JWS against
alice's CA and SPIFFE ID.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a import public_card
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, error_infos, gateway_reason, summary
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.push_receiver import (
    WebhookReceiver,
    attempts,
    pushed,
    webhook,
    with_push,
)
from tests.helpers.task_capabilities import TaskGate

ALICE, BOB = spiffe("alice"), spiffe("bob")
CAPS = ["job.run", "text.echo", "notes.write"]


async def start_alice(pki: Pki, base: Path, gate: TaskGate, ca: Path, **push: Any) -> Agent:
    policy = write_policy(
        base / "alice-policy.toml",
        [
            {**grant("bob", CAPS), "push_hosts": ["127.0.0.1", "receiver.test"]},
            grant("carol", CAPS),
        ],
    )
    registry = standard_registry(WriteCounter(), base / "alice-state")
    for cap in gate.capabilities():
        registry.register(cap)
    config = with_push(agent_config(pki, base, "alice", policy), ca, **push)
    return await started(config, registry)


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(tmp_path / "webhook") as webhook:
        yield webhook


@pytest.fixture
async def alice(
    pki: Pki, tmp_path: Path, gate: TaskGate, receiver: WebhookReceiver
) -> AsyncIterator[Agent]:
    agent = await start_alice(pki, tmp_path, gate, receiver.ca)
    yield agent
    await agent.stop()


@pytest.fixture
async def bob(pki: Pki, alice: Agent) -> AsyncIterator[A2APeer]:
    async with A2APeer(pki, alice, "bob") as peer:
        yield peer


async def records(agent: Agent) -> list[AuditRecord]:
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


async def test_the_card_offers_push_and_the_callers_card_says_whose_grant_allows_it(
    alice: Agent, pki: Pki
) -> None:
    assert public_card(ALICE, alice.card_issuer()).capabilities.push_notifications
    async with A2APeer(pki, alice, "bob") as bob, A2APeer(pki, alice, "carol") as carol:
        mine = await bob.client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
        theirs = await carol.client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
    assert mine.capabilities.push_notifications
    assert list(mine.capabilities.extensions[0].params["push_hosts"]) == [
        "127.0.0.1",
        "receiver.test",
    ]
    assert not theirs.capabilities.push_notifications


async def test_config_methods_with_the_sdk_client(
    alice: Agent, bob: A2APeer, pki: Pki, gate: TaskGate, receiver: WebhookReceiver
) -> None:
    request = data_request("job.run", {"tag": "a"})
    request.configuration.return_immediately = True
    task = await bob.send(request)
    created = await bob.client.create_task_push_notification_config(
        webhook(receiver.url(), task_id=task.id)
    )
    assert (created.id, created.task_id, created.url) == ("hook-1", task.id, receiver.url())
    assert created.authentication.credentials == "secret-456"
    unnamed = await bob.client.create_task_push_notification_config(
        a2a_pb2.TaskPushNotificationConfig(task_id=task.id, url=receiver.url("receiver.test"))
    )
    assert unnamed.id and unnamed.id != "hook-1"  # one is made
    got = await bob.client.get_task_push_notification_config(
        a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
    )
    assert got == created
    listed = await bob.client.list_task_push_notification_configs(
        a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert [c.id for c in listed.configs] == ["hook-1", unnamed.id]
    # Another caller sees none of it: the same answer as for a task that never existed.
    async with A2APeer(pki, alice, "carol") as carol:
        for task_id in (task.id, "no-such-task"):
            with pytest.raises(a2a_errors.TaskNotFoundError):
                await carol.client.get_task_push_notification_config(
                    a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task_id, id="hook-1")
                )
    for _ in range(2):  # idempotent
        await bob.client.delete_task_push_notification_config(
            a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
        )
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await bob.client.get_task_push_notification_config(
            a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
        )
    gate.release.set()
    rows = await records(alice)
    made = [(r.decision, r.reason, r.detail) for r in rows if "PushNotificationConfig" in r.detail]
    assert made[:2] == [
        (
            "allow",
            "OK",
            f"A2A CreateTaskPushNotificationConfig config=hook-1 host=127.0.0.1:{receiver.port}",
        ),
        (
            "allow",
            "OK",
            f"A2A CreateTaskPushNotificationConfig config={unnamed.id} "
            f"host=receiver.test:{receiver.port}",
        ),
    ]
    assert ("refuse", "TASK_NOT_FOUND", "A2A GetTaskPushNotificationConfig") in made
    assert made.count(("allow", "OK", "A2A DeleteTaskPushNotificationConfig config=hook-1")) == 2
    assert not any("secret-456" in r.detail or "tok-123" in r.detail for r in rows)


async def test_deleting_a_config_by_an_id_no_config_can_have_is_refused_and_audited(
    alice: Agent, bob: A2APeer, gate: TaskGate, receiver: WebhookReceiver
) -> None:
    request = data_request("job.run", {"tag": "a"})
    request.configuration.return_immediately = True
    task = await bob.send(request)
    await bob.client.create_task_push_notification_config(webhook(receiver.url(), task_id=task.id))
    before = len(await records(alice))
    for config_id in ("x" * 129, "hook 1", ""):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bob.stub.DeleteTaskPushNotificationConfig(
                a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=config_id),
                metadata=V1,
            )
        assert gateway_reason(info.value) == "INVALID_REQUEST"
    rows = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason, r.task_id) for r in rows] == [
        (BOB, "refuse", "INVALID_REQUEST", task.id)
    ] * 3
    assert not any("x" * 129 in r.detail for r in rows)
    listed = await bob.client.list_task_push_notification_configs(
        a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert [c.id for c in listed.configs] == ["hook-1"]
    gate.release.set()


async def test_deliveries_woken_as_the_agent_stops_still_stop(alice: Agent) -> None:
    # On Python 3.11, asyncio.wait_for lost a cancel that met its wake-up (gh-86296):
    # the delivery rounds went on for ever and the agent's stop never returned.
    dispatcher = alice.parts.push
    assert dispatcher is not None
    await asyncio.sleep(0.05)  # the rounds wait for work
    assert dispatcher.is_running
    dispatcher.wake()  # work arrives just before the stop's cancel
    stopping = asyncio.ensure_future(dispatcher.stop(grace=1.0))
    done, _ = await asyncio.wait([stopping], timeout=10)
    assert done == {stopping}
    assert not dispatcher.is_running


async def test_every_event_reaches_the_webhook_signed_with_the_agents_svid(
    alice: Agent, bob: A2APeer, pki: Pki, gate: TaskGate, receiver: WebhookReceiver
) -> None:
    url = receiver.url(path="/hook/a2a?source=alice")
    request = pushed(data_request("job.run", {"tag": "t"}), webhook(url))
    request.configuration.return_immediately = True
    task = await bob.send(request)
    await receiver.wait(3)  # WORKING, its progress, the chunk: then it waits
    gate.release.set()
    got = await receiver.wait(5)
    assert [summary(d.event()) for d in got] == [
        "status:WORKING",
        "status:WORKING:halfway",
        "artifact:chunks",
        "artifact:output",
        "status:COMPLETED",
    ]
    ca = (pki.dir / "ca.pem").read_bytes()
    ids = []
    for delivered in got:
        assert delivered.path == "/hook/a2a?source=alice"
        assert delivered.headers["authorization"] == "Bearer secret-456"
        assert delivered.headers["x-a2a-notification-token"] == "tok-123"
        assert delivered.headers["content-type"] == "application/a2a+json"
        assert delivered.headers["host"] == f"127.0.0.1:{receiver.port}"
        header = delivered.verified(ca, ALICE, url)
        assert header["kid"] == ALICE and header["alg"] == "ES256"
        ids.append(header["jti"])
        event = delivered.event()
        which = event.WhichOneof("payload")
        assert getattr(event, which).task_id == task.id
    rows = await attempts(alice, 5)
    assert [(r.decision, r.reason, r.peer_id, r.task_id) for r in rows] == [
        ("allow", "OK", BOB, task.id)
    ] * 5
    assert [r.request_id for r in rows] == ids
    assert rows[0].detail == (
        f"A2A push config=hook-1 host=127.0.0.1:{receiver.port} address=127.0.0.1 "
        "attempt=1/6 status=200"
    )
    assert rows[0].payload_size == len(got[0].body)
    everything = await records(alice)
    assert not any("source=alice" in r.detail or "secret-456" in r.detail for r in everything)


async def test_a_blocking_send_with_a_webhook_pushes_its_tasks_events(
    alice: Agent, bob: A2APeer, receiver: WebhookReceiver
) -> None:
    request = pushed(data_request("text.echo", {"text": "hi"}), webhook(receiver.url()))
    task = await bob.send(request)
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    got = await receiver.wait(3)
    assert [summary(d.event()) for d in got] == [
        "status:WORKING",
        "artifact:output",
        "status:COMPLETED",
    ]
    stored = await bob.client.list_task_push_notification_configs(
        a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert [(c.id, c.task_id) for c in stored.configs] == [("hook-1", task.id)]


async def test_callers_without_push_hosts_and_urls_outside_them_are_refused(
    alice: Agent, bob: A2APeer, pki: Pki, receiver: WebhookReceiver
) -> None:
    task = await bob.send(data_request("text.echo", {"text": "x"}))
    refused = [
        "http://127.0.0.1/hook",  # not https
        "https://elsewhere.test/hook",  # not in push_hosts
        "https://user:pw@127.0.0.1/hook",  # user info
        "https://127.1/hook",  # a spelling of 127.0.0.1 that is no IP literal
        "https://2130706433/hook",
        "https://[::ffff:7f00:1]/hook",  # not named (only the IPv4 spelling is)
        "https://receiver.test\\@127.0.0.1/hook",
        "https://receiver.test/hook#frag",
        "ftp://receiver.test/hook",
    ]
    for url in refused:
        with pytest.raises(a2a_errors.InvalidParamsError):
            await bob.client.create_task_push_notification_config(
                a2a_pb2.TaskPushNotificationConfig(task_id=task.id, url=url)
            )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await bob.stub.CreateTaskPushNotificationConfig(
            webhook(receiver.url(), task_id=task.id, tenant="t"), metadata=V1, timeout=10
        )
    assert gateway_reason(info.value) == "INVALID_REQUEST"
    async with A2APeer(pki, alice, "carol") as carol:
        mine = await carol.send(data_request("text.echo", {"text": "x"}))
        with pytest.raises(a2a_errors.PushNotificationNotSupportedError):
            await carol.client.create_task_push_notification_config(
                webhook(receiver.url(), task_id=mine.id)
            )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await carol.stub.SendMessage(
                pushed(data_request("notes.write", {"note": "n"}), webhook(receiver.url())),
                metadata=V1,
                timeout=10,
            )
    assert gateway_reason(info.value) == "PUSH_NOT_GRANTED"
    assert ("a2a-protocol.org", "PUSH_NOTIFICATION_NOT_SUPPORTED") in error_infos(info.value)
    rows = await records(alice)
    refusals = [(r.peer_id, r.reason) for r in rows if r.decision == "refuse"]
    assert refusals == [(BOB, "PUSH_URL_REFUSED")] * len(refused) + [
        (BOB, "INVALID_REQUEST"),
        (spiffe("carol"), "PUSH_NOT_GRANTED"),
        (spiffe("carol"), "PUSH_NOT_GRANTED"),
    ]
    assert [r.capability for r in rows if r.peer_id == spiffe("carol")][-1] == ""
    assert receiver.received == []


async def test_config_limit_per_task(
    pki: Pki, tmp_path: Path, gate: TaskGate, receiver: WebhookReceiver
) -> None:
    agent = await start_alice(pki, tmp_path, gate, receiver.ca, max_configs_per_task=2)
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            task = await bob.send(data_request("text.echo", {"text": "x"}))
            for config_id in ("a", "b", "a"):  # replacing one keeps the count
                await bob.client.create_task_push_notification_config(
                    webhook(receiver.url(), config_id, task_id=task.id)
                )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bob.stub.CreateTaskPushNotificationConfig(
                    webhook(receiver.url(), "c", task_id=task.id), metadata=V1, timeout=10
                )
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert gateway_reason(info.value) == "PUSH_CONFIG_LIMIT"
    finally:
        await agent.stop()


async def test_push_off_refuses_a_message_carrying_a_webhook(
    alice_plain: Agent, pki: Pki, counter: WriteCounter
) -> None:
    async with A2APeer(pki, alice_plain, "bob") as bob:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bob.stub.SendMessage(
                pushed(data_request("notes.write", {"note": "n"}), webhook("https://127.0.0.1/h")),
                metadata=V1,
                timeout=10,
            )
    assert gateway_reason(info.value) == "PUSH_NOTIFICATION_NOT_SUPPORTED"
    assert counter.calls == 0
    assert not public_card(ALICE, alice_plain.card_issuer()).capabilities.push_notifications


@pytest.fixture
async def alice_plain(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [{**grant("bob", CAPS), "push_hosts": ["127.0.0.1"]}],
    )
    config = agent_config(pki, tmp_path, "alice", policy)
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


@pytest.mark.parametrize(
    "method",
    [
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    ],
)
async def test_corrupt_push_requests_are_audited_invalid_requests(
    alice: Agent, bob: A2APeer, method: str
) -> None:
    call = bob.channel.unary_unary(
        f"/lf.a2a.v1.A2AService/{method}",
        request_serializer=lambda raw: raw,
        response_deserializer=lambda raw: raw,
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"\xff\xff\xff\xff", metadata=V1, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert gateway_reason(info.value) == "INVALID_REQUEST"
    rows = await records(alice)
    assert (rows[-1].decision, rows[-1].reason, rows[-1].peer_id) == (
        "refuse",
        "INVALID_REQUEST",
        BOB,
    )
