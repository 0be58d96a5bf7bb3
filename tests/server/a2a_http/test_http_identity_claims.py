"""An identity claimed in a request's metadata is refused UNAUTHENTICATED, on every binding.

Only the TLS handshake names the caller. A request that names one itself in
the gateway's own metadata keys (``a2agw.peer``, ...) is refused, audited
under the caller the handshake verified, and nothing runs: the same on the
gRPC binding and on both HTTP bindings, for a message and for a task method.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from gateway.runtime.agent import Agent
from gateway.server.a2a.messages import IDENTITY_KEYS
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.helpers.a2a_grpc import V1, A2APeer, gateway_reason
from tests.helpers.a2a_http import V1_HEADERS, https_client, jsonrpc, message_params, our_reason
from tests.helpers.agents import Pki, WriteCounter, audit_rows, spiffe

BINDINGS = ["grpc", "jsonrpc", "rest"]


async def send_reason(pki: Pki, agent: Agent, binding: str, params: dict[str, Any]) -> str:
    """Our reason code for a SendMessage of ``params`` (JSON form) from bob."""
    if binding == "grpc":
        request = json_format.ParseDict(params, a2a_pb2.SendMessageRequest())
        async with A2APeer(pki, agent, "bob") as bob:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bob.stub.SendMessage(request, metadata=V1, timeout=20)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        return gateway_reason(info.value)
    async with https_client(pki, "bob") as client:
        if binding == "jsonrpc":
            answer = await client.post(
                agent.https_url + JSONRPC_PATH,
                json=jsonrpc("SendMessage", params),
                headers=V1_HEADERS,
            )
            return our_reason(answer.json()["error"]["data"])
        response = await client.post(
            agent.https_url + REST_PATH + "/message:send", json=params, headers=V1_HEADERS
        )
        assert response.status_code == 401
        return our_reason(response.json()["error"]["details"])


async def cancel_reason(pki: Pki, agent: Agent, binding: str, metadata: dict[str, Any]) -> str:
    """Our reason code for bob's CancelTask carrying ``metadata``."""
    if binding == "grpc":
        request = a2a_pb2.CancelTaskRequest(id="some-task")
        request.metadata.update(metadata)
        async with A2APeer(pki, agent, "bob") as bob:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bob.stub.CancelTask(request, metadata=V1, timeout=20)
        return gateway_reason(info.value)
    async with https_client(pki, "bob") as client:
        if binding == "jsonrpc":
            answer = await client.post(
                agent.https_url + JSONRPC_PATH,
                json=jsonrpc("CancelTask", {"id": "some-task", "metadata": metadata}),
                headers=V1_HEADERS,
            )
            return our_reason(answer.json()["error"]["data"])
        response = await client.post(
            f"{agent.https_url}{REST_PATH}/tasks/some-task:cancel",
            json={"metadata": metadata},
            headers=V1_HEADERS,
        )
        return our_reason(response.json()["error"]["details"])


async def new_rows(agent: Agent, before: int) -> list[tuple[str, str, str]]:
    await agent.audit.flush()
    return [(r.peer_id, r.decision, r.reason) for r in audit_rows(agent.config.audit_db)[before:]]


async def rows_now(agent: Agent) -> int:
    await agent.audit.flush()
    return len(audit_rows(agent.config.audit_db))


@pytest.mark.parametrize("key", sorted(IDENTITY_KEYS))
@pytest.mark.parametrize("binding", BINDINGS)
async def test_an_identity_in_message_metadata_is_refused_and_nothing_runs(
    pki: Pki, alice: Agent, counter: WriteCounter, binding: str, key: str
) -> None:
    params = message_params("notes.write", {"note": "x"})
    params["message"]["metadata"][key] = spiffe("carol")
    before = await rows_now(alice)
    assert await send_reason(pki, alice, binding, params) == "UNAUTHENTICATED"
    assert await new_rows(alice, before) == [(spiffe("bob"), "refuse", "UNAUTHENTICATED")]
    assert counter.calls == 0


@pytest.mark.parametrize("binding", BINDINGS)
async def test_an_identity_in_request_metadata_is_refused_whatever_its_value(
    pki: Pki, alice: Agent, counter: WriteCounter, binding: str
) -> None:
    params = message_params("notes.write", {"note": "x"})
    params["metadata"] = {"a2agw.peer": {"spiffe_id": spiffe("carol")}}  # not even a string
    before = await rows_now(alice)
    assert await send_reason(pki, alice, binding, params) == "UNAUTHENTICATED"
    assert await new_rows(alice, before) == [(spiffe("bob"), "refuse", "UNAUTHENTICATED")]
    assert counter.calls == 0


@pytest.mark.parametrize(
    ("binding", "reason"),
    [
        ("grpc", "UNAUTHENTICATED"),
        ("jsonrpc", "UNAUTHENTICATED"),
        # The HTTP+JSON cancel route takes the task id from its path and never
        # reads a body (the SDK's): a claim there is never seen, so ignored.
        ("rest", "TASK_NOT_FOUND"),
    ],
)
async def test_an_identity_in_a_task_methods_metadata_is_refused(
    pki: Pki, alice: Agent, binding: str, reason: str
) -> None:
    before = await rows_now(alice)
    answered = await cancel_reason(pki, alice, binding, {"a2agw.caller": spiffe("carol")})
    assert answered == reason
    assert await new_rows(alice, before) == [(spiffe("bob"), "refuse", reason)]


async def test_other_metadata_about_the_caller_is_ignored(pki: Pki, alice: Agent) -> None:
    params = message_params("text.echo", {"text": "hi"})
    params["message"]["metadata"]["caller"] = spiffe("carol")  # not ours: ignored
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendMessage", params),
            headers=V1_HEADERS,
        )
    assert answer.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
