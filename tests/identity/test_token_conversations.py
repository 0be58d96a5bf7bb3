"""A caller identified by a bearer token alone continues its own conversation on HTTPS.

The follow-up finds its task by the identity the HTTP edge verified from the
token (there is no certificate), passes the whole decision order with that
token again, and completes the task; another token's caller does not find it.
A task started for a user (``A2AGW-User-Token``) is continued only for that
same user: the same caller acting for another user, or for none, does not
find it.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format

from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import V1, A2APeer, gateway_reason
from tests.helpers.a2a_http import serving_https
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations
from tests.helpers.token_issuer import ALICE, SessionIssuer, SvidKeys, token_settings, with_tokens


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
async def alice(
    pki: Pki,
    tmp_path: Path,
    issuer: SessionIssuer,
    svid: SvidKeys,
    conversations: Conversations,
) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "alice-policy.toml", [grant("bob", CAPABILITIES), grant("carol", CAPABILITIES)]
    )
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in conversations.capabilities():
        registry.register(cap)
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(with_tokens(config, token_settings(issuer, svid)), registry)
    yield agent
    await agent.stop()


async def token_client(pki: Pki, agent: Agent, token: str) -> tuple[httpx.AsyncClient, Client]:
    http = httpx.AsyncClient(
        verify=ssl.create_default_context(cafile=str(pki.dir / "ca.pem")),
        headers={"Authorization": f"Bearer {token}"},
        timeout=20,
    )
    config = ClientConfig(
        httpx_client=http, streaming=False, supported_protocol_bindings=["JSONRPC"]
    )
    return http, await create_client(agent.https_url, config)


def message(
    capability: str = "", *, text: str | None = None, data: dict[str, str] | None = None,
    task_id: str = "",
) -> a2a_pb2.SendMessageRequest:  # fmt: skip
    sent = a2a_pb2.Message(message_id=str(uuid.uuid4()), role=a2a_pb2.ROLE_USER, task_id=task_id)
    if capability:
        sent.metadata["a2agw.capability"] = capability
    if text is not None:
        sent.parts.add(text=text)
    if data is not None:
        json_format.ParseDict(data, sent.parts.add().data)
    return a2a_pb2.SendMessageRequest(message=sent)


async def send(client: Client, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.Task:
    [event] = [event async for event in client.send_message(request)]
    return event.task


async def test_a_token_only_caller_continues_its_own_conversation(
    pki: Pki, alice: Agent, issuer: SessionIssuer, svid: SvidKeys
) -> None:
    http, bob = await token_client(pki, alice, issuer.token("bob-client", ALICE))
    other, carol = await token_client(pki, alice, svid.token("carol", ALICE))
    try:
        task = await send(bob, message("trip.book", text="away"))
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        with pytest.raises(a2a_errors.TaskNotFoundError):
            await send(carol, message(data={"city": "Rome"}, task_id=task.id))
        done = await send(bob, message(data={"city": "Rome"}, task_id=task.id))
        assert (done.id, done.status.state) == (task.id, a2a_pb2.TASK_STATE_COMPLETED)
    finally:
        await http.aclose()
        await other.aclose()


async def test_a_task_started_for_a_user_is_continued_only_for_that_user(
    pki: Pki, alice: Agent, issuer: SessionIssuer, conversations: Conversations
) -> None:
    def acting_for(user: str) -> tuple[tuple[str, str], ...]:
        return (*V1, ("a2agw-user-token", issuer.token(user, ALICE, azp="bob-client")))

    async with A2APeer(pki, alice, "bob") as bob:
        first = await bob.stub.SendMessage(
            message("trip.book", text="away"), metadata=acting_for("user-1"), timeout=20
        )
        task = first.task
        assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
        refused = []
        for metadata in (acting_for("user-2"), V1):  # another user of bob's, and none
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bob.stub.SendMessage(
                    message(data={"city": "Rome"}, task_id=task.id), metadata=metadata, timeout=20
                )
            refused.append((info.value.code(), gateway_reason(info.value)))
        assert refused == [(grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")] * 2
        assert [name for name, _ in conversations.seen] == ["trip.book"]  # not resumed
        await alice.audit.flush()
        rows = [r for r in audit_rows(alice.config.audit_db) if r.task_id == task.id]
        assert [(r.decision, r.reason, r.on_behalf_of) for r in rows] == [
            ("refuse", "TASK_NOT_FOUND", "user-2"),
            ("refuse", "TASK_NOT_FOUND", ""),
        ]
        done = await bob.stub.SendMessage(
            message(data={"city": "Oslo"}, task_id=task.id),
            metadata=acting_for("user-1"),
            timeout=20,
        )
        assert done.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
