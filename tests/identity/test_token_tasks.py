"""A2A tasks are per caller and user: the same agent acting for another user finds nothing.

bob starts a task acting for user-1 (``A2AGW-User-Token``). Acting for user-2,
or for no user, every task method (GetTask, SubscribeToTask, CancelTask, the
four push-config methods, a follow-up) answers ``TASK_NOT_FOUND``, as for
another peer's task: one refusal record each, and the task left as it was;
ListTasks omits it. Across replicas (a shared PostgreSQL) the task's row keeps
its user, so user-1's follow-up on the other replica continues it, and
another user's is ``TASK_NOT_FOUND`` there too.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversations import message, records
from tests.helpers.a2a_grpc import V1, A2APeer, gateway_reason
from tests.helpers.a2a_http import serving_https
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    started_replicas,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations
from tests.helpers.push_receiver import WebhookReceiver, webhook, with_push
from tests.helpers.token_issuer import ALICE, SessionIssuer, SvidKeys, token_settings, with_tokens

Metadata = tuple[tuple[str, str], ...]


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(tmp_path / "webhook") as hook:
        yield hook


def _registry(conversations: Conversations, state: Path) -> Any:
    registry = standard_registry(WriteCounter(), state)
    for cap in conversations.capabilities():
        registry.register(cap)
    return registry


@pytest.fixture
async def alice(
    pki: Pki,
    tmp_path: Path,
    issuer: SessionIssuer,
    svid: SvidKeys,
    conversations: Conversations,
    receiver: WebhookReceiver,
) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [{**grant("bob", CAPABILITIES), "push_hosts": ["127.0.0.1"]}],
    )
    config = with_push(agent_config(pki, tmp_path, "alice", policy), receiver.ca)
    config = serving_https(config, pki, tmp_path / "https")
    agent = await started(
        with_tokens(config, token_settings(issuer, svid)),
        _registry(conversations, tmp_path / "alice-state"),
    )
    yield agent
    await agent.stop()


def _acting_for(issuer: SessionIssuer, user: str) -> Metadata:
    return (*V1, ("a2agw-user-token", issuer.token(user, ALICE, azp="bob-client")))


async def _refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    """(code, reason) of a refused unary call or stream (its first read)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if isinstance(call, grpc.aio.UnaryStreamCall):
            async for _ in call:
                pass
        else:
            await call
    return info.value.code(), gateway_reason(info.value)


def _task_calls(bob: A2APeer, task_id: str, metadata: Metadata) -> list[Callable[[], Any]]:
    """Every task method on ``task_id``, each started when called (none may change it)."""
    stub, config_id, timeout = bob.stub, "hook-1", 20
    other = webhook("https://127.0.0.1:9/other", "hook-2", task_id=task_id)
    return [
        lambda: stub.GetTask(
            a2a_pb2.GetTaskRequest(id=task_id), metadata=metadata, timeout=timeout
        ),
        lambda: stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task_id), metadata=metadata, timeout=timeout
        ),
        lambda: stub.CancelTask(
            a2a_pb2.CancelTaskRequest(id=task_id), metadata=metadata, timeout=timeout
        ),
        lambda: stub.GetTaskPushNotificationConfig(
            a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task_id, id=config_id),
            metadata=metadata,
            timeout=timeout,
        ),
        lambda: stub.ListTaskPushNotificationConfigs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task_id),
            metadata=metadata,
            timeout=timeout,
        ),
        lambda: stub.CreateTaskPushNotificationConfig(other, metadata=metadata, timeout=timeout),
        lambda: stub.DeleteTaskPushNotificationConfig(
            a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=config_id),
            metadata=metadata,
            timeout=timeout,
        ),
        lambda: stub.SendMessage(
            message(data={"city": "Rome"}, task_id=task_id), metadata=metadata, timeout=timeout
        ),
    ]


TASK_METHODS = [
    "A2A GetTask",
    "A2A SubscribeToTask",
    "A2A CancelTask",
    "A2A GetTaskPushNotificationConfig",
    "A2A ListTaskPushNotificationConfigs",
    "A2A CreateTaskPushNotificationConfig",
    "A2A DeleteTaskPushNotificationConfig",
    "follow-up",
]


async def test_another_user_of_the_same_caller_finds_no_task(
    pki: Pki,
    alice: Agent,
    issuer: SessionIssuer,
    conversations: Conversations,
    receiver: WebhookReceiver,
) -> None:
    user_1, user_2 = _acting_for(issuer, "user-1"), _acting_for(issuer, "user-2")
    async with A2APeer(pki, alice, "bob") as bob:
        first = await bob.stub.SendMessage(
            message("trip.book", text="away"), metadata=user_1, timeout=20
        )
        task = first.task
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        made = await bob.stub.CreateTaskPushNotificationConfig(
            webhook(receiver.url(), "hook-1", task_id=task.id), metadata=user_1, timeout=20
        )
        assert made.id == "hook-1"
        await alice.audit.flush()
        before = len(await records(alice))

        for metadata, user in ((user_2, "user-2"), (V1, "")):  # another user of bob's, and none
            refused = [await _refusal(call()) for call in _task_calls(bob, task.id, metadata)]
            assert refused == [(grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")] * 8
            listed = await bob.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=metadata)
            assert (list(listed.tasks), listed.total_size) == ([], 0)
            rows = (await records(alice))[before:]
            before += len(rows)
            # One refusal each, for that task; the follow-up's names its user, as before.
            assert [(r.decision, r.reason, r.task_id) for r in rows] == [
                ("refuse", "TASK_NOT_FOUND", task.id)
            ] * 8
            assert [
                "follow-up" if r.detail.startswith("follow-up") else r.detail for r in rows
            ] == TASK_METHODS
            assert [r.on_behalf_of for r in rows] == [""] * 7 + [user]

        # Nothing changed: still waiting, not resumed, its webhook config as it was.
        assert [name for name, _ in conversations.seen] == ["trip.book"]
        own = await bob.stub.GetTask(a2a_pb2.GetTaskRequest(id=task.id), metadata=user_1)
        assert own.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        configs = await bob.stub.ListTaskPushNotificationConfigs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id), metadata=user_1
        )
        assert [c.id for c in configs.configs] == ["hook-1"]
        listed = await bob.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=user_1)
        assert [t.id for t in listed.tasks] == [task.id]
        subscription = bob.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=user_1, timeout=20
        )
        assert (await anext(aiter(subscription))).task.id == task.id
        subscription.cancel()
        done = await bob.stub.SendMessage(
            message(data={"city": "Oslo"}, task_id=task.id), metadata=user_1, timeout=20
        )
        assert done.task.status.state == a2a_pb2.TASK_STATE_COMPLETED


async def test_a_task_started_for_no_user_is_not_found_for_a_user(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    async with A2APeer(pki, alice, "bob") as bob:
        first = await bob.stub.SendMessage(message("trip.book", text="away"), metadata=V1)
        task = first.task
        user_1 = _acting_for(issuer, "user-1")
        call = bob.stub.GetTask(a2a_pb2.GetTaskRequest(id=task.id), metadata=user_1)
        assert await _refusal(call) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
        listed = await bob.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=user_1)
        assert list(listed.tasks) == []
        own = await bob.stub.GetTask(a2a_pb2.GetTaskRequest(id=task.id), metadata=V1)
        assert own.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED


async def _jsonrpc_client(pki: Pki, agent: Agent, headers: dict[str, str]) -> Any:
    http = httpx.AsyncClient(
        verify=ssl.create_default_context(cafile=str(pki.dir / "ca.pem")),
        headers=headers,
        timeout=20,
    )
    config = ClientConfig(
        httpx_client=http, streaming=False, supported_protocol_bindings=["JSONRPC"]
    )
    return http, await create_client(agent.https_url, config)


async def test_over_json_rpc_a_token_only_caller_finds_only_its_users_tasks(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    bearer = {"Authorization": f"Bearer {issuer.token('bob-client', ALICE)}"}
    clients = {
        user: await _jsonrpc_client(
            pki,
            alice,
            {**bearer, "A2AGW-User-Token": issuer.token(user, ALICE, azp="bob-client")},
        )
        for user in ("user-1", "user-2")
    }
    clients[""] = await _jsonrpc_client(pki, alice, bearer)
    try:
        [event] = [
            e async for e in clients["user-1"][1].send_message(message("trip.book", text="away"))
        ]
        task = event.task
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        for user in ("user-2", ""):
            client = clients[user][1]
            with pytest.raises(a2a_errors.TaskNotFoundError):
                await client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            with pytest.raises(a2a_errors.TaskNotFoundError):
                await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
            listed = await client.list_tasks(a2a_pb2.ListTasksRequest())
            assert list(listed.tasks) == []
        own = await clients["user-1"][1].get_task(a2a_pb2.GetTaskRequest(id=task.id))
        assert own.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    finally:
        for http, _ in clients.values():
            await http.aclose()


# --- replicas: the row keeps the user ------------------------------------------


@pytest.fixture
async def replicas(
    pki: Pki,
    tmp_path: Path,
    pg_dsn: str,
    issuer: SessionIssuer,
    svid: SvidKeys,
    conversations: Conversations,
) -> AsyncIterator[list[Agent]]:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", CAPABILITIES)])
    agents = await started_replicas(
        pki,
        tmp_path,
        pg_dsn,
        policy,
        conversations.capabilities(),
        lambda config: with_tokens(config, token_settings(issuer, svid)),
    )
    yield agents
    for agent in agents:
        await agent.stop()


async def test_a_follow_up_on_another_replica_continues_only_for_the_tasks_user(
    pki: Pki, replicas: list[Agent], issuer: SessionIssuer, conversations: Conversations
) -> None:
    one, two = replicas
    user_1 = _acting_for(issuer, "user-1")
    async with A2APeer(pki, one, "bob") as bob_one, A2APeer(pki, two, "bob") as bob_two:
        first = await bob_one.stub.SendMessage(
            message("trip.book", text="away"), metadata=user_1, timeout=20
        )
        task = first.task
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        for metadata in (_acting_for(issuer, "user-2"), V1):
            answer = message(data={"city": "Rome"}, task_id=task.id)
            call = bob_two.stub.SendMessage(answer, metadata=metadata, timeout=20)
            assert await _refusal(call) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
            read = bob_two.stub.GetTask(a2a_pb2.GetTaskRequest(id=task.id), metadata=metadata)
            assert await _refusal(read) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
        assert [name for name, _ in conversations.seen] == ["trip.book"]  # not resumed
        seen = await bob_two.stub.GetTask(a2a_pb2.GetTaskRequest(id=task.id), metadata=user_1)
        assert seen.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        done = await bob_two.stub.SendMessage(
            message(data={"city": "Oslo"}, task_id=task.id, message_id="a-1"),
            metadata=user_1,
            timeout=30,
        )
        assert (done.task.id, done.task.status.state) == (task.id, a2a_pb2.TASK_STATE_COMPLETED)
    rows = [r for r in await records(one) if r.task_id == task.id]
    assert [(r.decision, r.reason, r.on_behalf_of, r.request_id == "a-1") for r in rows] == [
        ("refuse", "TASK_NOT_FOUND", "user-2", False),
        ("refuse", "TASK_NOT_FOUND", "", False),
        ("refuse", "TASK_NOT_FOUND", "", False),
        ("refuse", "TASK_NOT_FOUND", "", False),
        ("allow", "OK", "user-1", True),  # the answer, audited by the replica that took it
        ("allow", "OK", "user-1", False),  # the task's run
    ]
