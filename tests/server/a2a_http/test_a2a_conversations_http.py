"""Conversations, parts and Message answers over the HTTP bindings, with the a2a-sdk client.

The same servicer serves JSON-RPC and HTTP+JSON, so these check the wire of
each: a multi-turn conversation through input-required, a file part in and a
text artifact out, a Message answer, and CONTENT_TYPE_NOT_SUPPORTED (JSON-RPC
-32005, HTTP 415).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.helpers.a2a_conversations import message, records, texts
from tests.helpers.a2a_http import V1_HEADERS, client_context, jsonrpc, serving_https
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
from tests.helpers.node_projects import A2A_JS, node_ready

BINDINGS = ["JSONRPC", "HTTP+JSON"]


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", CAPABILITIES)])
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in Conversations().capabilities():
        registry.register(cap)
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, registry)
    yield agent
    await agent.stop()


@pytest.fixture
async def http(pki: Pki) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=client_context(pki, "bob"), timeout=10.0) as client:
        yield client


async def sdk(alice: Agent, http: httpx.AsyncClient, binding: str) -> Client:
    assert alice.https_url is not None
    config = ClientConfig(httpx_client=http, streaming=False, supported_protocol_bindings=[binding])
    return await create_client(alice.https_url, config)


async def send(client: Client, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.StreamResponse:
    [event] = [event async for event in client.send_message(request)]
    return event


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_multi_turn_conversation_through_input_required(
    alice: Agent, http: httpx.AsyncClient, binding: str
) -> None:
    client = await sdk(alice, http, binding)
    task = (await send(client, message("chat.loop", text="one"))).task
    assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    assert texts(task.status.message) == ["got 1; more?"]
    second = (await send(client, message(text="two", task_id=task.id))).task
    assert (second.id, second.status.state) == (task.id, a2a_pb2.TASK_STATE_INPUT_REQUIRED)
    done = (await send(client, message(text="done", task_id=task.id))).task
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert [texts(a) for a in done.artifacts] == [["one two"]]
    assert len(done.history) == 5
    with pytest.raises(a2a_errors.UnsupportedOperationError):
        await send(client, message(text="more", task_id=task.id))
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await send(client, message(text="more", task_id="no-such-task"))


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_file_part_in_and_a_text_artifact_out(
    alice: Agent, http: httpx.AsyncClient, binding: str
) -> None:
    client = await sdk(alice, http, binding)
    request = message("doc.words")
    request.message.parts.add(raw=b"alpha beta", media_type="text/plain", filename="a.txt")
    task = (await send(client, request)).task
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert [texts(a) for a in task.artifacts] == [["a.txt: 2 words"]]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_message_answer(alice: Agent, http: httpx.AsyncClient, binding: str) -> None:
    client = await sdk(alice, http, binding)
    event = await send(client, message("chat.reply", text="web"))
    assert event.WhichOneof("payload") == "message"
    assert texts(event.message) == ["hello web"]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_artifacts_of_every_kind_reach_the_sdk(
    alice: Agent, http: httpx.AsyncClient, binding: str
) -> None:
    client = await sdk(alice, http, binding)
    task = (await send(client, message("out.kinds", text="all"))).task
    text, file, url, data = (a.parts[0] for a in task.artifacts)
    assert text.text == "Generated text content"
    assert (file.raw, file.media_type, file.filename) == (b"tck", "text/plain", "output.txt")
    assert url.url == "https://example.com/output.txt"
    assert json_format.MessageToDict(data.data) == {"key": "value", "count": 42.0}


async def test_content_type_not_supported_on_each_binding(
    alice: Agent, http: httpx.AsyncClient
) -> None:
    assert alice.https_url is not None
    part = {"raw": "iVBORw==", "mediaType": "image/png"}
    params = {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "parts": [part],
            "metadata": {"a2agw.capability": "doc.words"},
        }
    }
    answer = await http.post(
        alice.https_url + JSONRPC_PATH, json=jsonrpc("SendMessage", params), headers=V1_HEADERS
    )
    assert answer.json()["error"]["code"] == -32005
    params["message"]["messageId"] = str(uuid.uuid4())  # type: ignore[index]
    rest = await http.post(
        alice.https_url + REST_PATH + "/message:send", json=params, headers=V1_HEADERS
    )
    assert rest.status_code == 415
    assert rest.json()["error"]["details"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    rows = (await records(alice))[-2:]
    assert [(r.decision, r.reason) for r in rows] == [("refuse", "CONTENT_TYPE_NOT_SUPPORTED")] * 2


async def test_the_javascript_sdk_converses_on_three_bindings(
    pki: Pki, alice: Agent, tmp_path: Path
) -> None:
    node_ready(A2A_JS, "@a2a-js/sdk")
    config = tmp_path / "node-conversation.json"
    config.write_text(
        json.dumps(
            {
                "https_url": alice.https_url,
                "server_id": spiffe("alice"),
                "ca": str(pki.dir / "ca.pem"),
                "cert": str(pki.dir / "bob.pem"),
                "key": str(pki.dir / "bob.key"),
            }
        )
    )
    node = await asyncio.create_subprocess_exec(
        "node",
        str(A2A_JS / "conversation_client.mjs"),
        str(config),
        cwd=A2A_JS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), 120)
    assert node.returncode == 0, err.decode()[-3000:]
    answer = json.loads(out)
    for binding in ("JSONRPC", "HTTP+JSON", "GRPC"):
        got = answer[binding]
        assert "error" not in got, got
        assert got["asked"] == ["INPUT_REQUIRED", ["got 1; more?"]], got
        assert got["answered"] == [True, "INPUT_REQUIRED", ["got 2; more?"]], got
        assert got["done"] == [True, "COMPLETED", [["one two"]]], got
        assert got["history"] == 5, got
        assert got["counted"] == ["COMPLETED", [["notes.txt: 3 words"]]], got
        assert got["reply"] == {"kind": "message", "texts": ["hello js"], "role": 2}, got
