"""Streaming, subscriptions and cancel over the HTTP bindings (SSE), with the real servicer.

alice streams ``SendStreamingMessage`` and ``SubscribeToTask`` (the same
servicer methods as on gRPC, through the edge and HTTPS server): on both
bindings the first event is the task, then its status updates and artifacts
in order, the last terminal. A refusal before the first event is the
binding's error with our reason code, audited once, and runs nothing;
CancelTask over HTTP cancels a running task (its capability sees
``CancelledError``) and is audited with the canceller; and the a2a-sdk client
streams because the card says so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import (
    V1_HEADERS,
    https_client,
    jsonrpc,
    message_params,
    our_reason,
    serving_https,
)
from tests.support import (
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
from tests.task_capabilities import TaskGate

BOB = spiffe("bob")
SSE_HEADERS = {**V1_HEADERS, "Accept": "text/event-stream"}
BINDINGS = ["jsonrpc", "rest"]


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, gate: TaskGate) -> AsyncIterator[Agent]:
    """alice serving HTTPS with the gate's ``job.run``; bob may run it, carol may not."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", ["text.echo", "job.run"]), grant("carol", ["text.echo"])],
    )
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in gate.capabilities():
        registry.register(cap)
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, registry)
    yield agent
    await agent.stop()


async def records(agent: Agent) -> list[AuditRecord]:
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


def summary(event: dict[str, Any]) -> str:
    """``task:SUBMITTED``, ``status:WORKING[:text]``, ``artifact:<id suffix>`` of one SSE event."""
    response = a2a_pb2.StreamResponse()
    json_format.ParseDict(event, response, ignore_unknown_fields=True)
    kind = response.WhichOneof("payload")
    if kind == "task":
        return f"task:{_state(response.task.status.state)}"
    if kind == "status_update":
        status = response.status_update.status
        text = status.message.parts[0].text if status.message.parts else ""
        return f"status:{_state(status.state)}" + (f":{text}" if text else "")
    assert kind == "artifact_update", event
    return "artifact:" + response.artifact_update.artifact.artifact_id.rsplit("-", 1)[-1]


def _state(state: int) -> str:
    return str(a2a_pb2.TaskState.Name(state)).removeprefix("TASK_STATE_")


async def sse(
    client: httpx.AsyncClient, method: str, url: str, body: Any, request_id: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The events of one SSE answer (JSON-RPC: each ``result``, its id checked)."""
    async with client.stream(method, url, json=body, headers=SSE_HEADERS) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            event: dict[str, Any] = json.loads(line[5:])
            if request_id is not None:
                assert event["id"] == request_id, event
                event = event["result"]
            yield event


def stream_of(
    client: httpx.AsyncClient, agent: Agent, binding: str, params: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """SendStreamingMessage on ``binding``."""
    if binding == "jsonrpc":
        body = jsonrpc("SendStreamingMessage", params, 5)
        return sse(client, "POST", agent.https_url + JSONRPC_PATH, body, 5)
    return sse(client, "POST", agent.https_url + REST_PATH + "/message:stream", params)


def subscription(
    client: httpx.AsyncClient, agent: Agent, binding: str, task_id: str
) -> AsyncIterator[dict[str, Any]]:
    """SubscribeToTask on ``binding``."""
    if binding == "jsonrpc":
        body = jsonrpc("SubscribeToTask", {"id": task_id}, 6)
        return sse(client, "POST", agent.https_url + JSONRPC_PATH, body, 6)
    url = f"{agent.https_url}{REST_PATH}/tasks/{task_id}:subscribe"
    return sse(client, "POST", url, {})


async def call(
    client: httpx.AsyncClient,
    agent: Agent,
    binding: str,
    method: str,
    params: dict[str, Any],
    rest: tuple[str, str],
) -> httpx.Response:
    """One unary call on ``binding`` (``rest``: its HTTP method and path)."""
    if binding == "jsonrpc":
        return await client.post(
            agent.https_url + JSONRPC_PATH, json=jsonrpc(method, params), headers=V1_HEADERS
        )
    verb, path = rest
    return await client.request(
        verb, agent.https_url + REST_PATH + path, json=params, headers=V1_HEADERS
    )


def task_of(response: httpx.Response, binding: str) -> dict[str, Any]:
    """The task a unary call answered (JSON-RPC: its result; REST: the body)."""
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    if binding == "jsonrpc":
        assert "error" not in body, body
        body = body["result"]
    task: dict[str, Any] = body.get("task", body)
    return task


async def background(client: httpx.AsyncClient, agent: Agent, binding: str, gate: TaskGate) -> str:
    """``job.run`` sent with ``return_immediately``, running (waiting at the gate): its id."""
    params = message_params("job.run", {"tag": binding})
    params["configuration"] = {"returnImmediately": True}
    response = await call(client, agent, binding, "SendMessage", params, ("POST", "/message:send"))
    task = task_of(response, binding)
    assert task["status"]["state"] in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}
    await asyncio.wait_for(gate.started.wait(), 10)
    task_id: str = task["id"]
    return task_id


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_stream_is_the_task_then_its_events_in_order_ending_terminal(
    pki: Pki, alice: Agent, gate: TaskGate, binding: str
) -> None:
    seen: list[dict[str, Any]] = []
    async with https_client(pki, "bob") as client:
        async for event in stream_of(
            client, alice, binding, message_params("job.run", {"tag": "s"})
        ):
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
    task_id = seen[0]["task"]["id"]
    assert {e["statusUpdate"]["taskId"] for e in seen if "statusUpdate" in e} == {task_id}
    assert seen[4]["artifactUpdate"]["artifact"]["parts"][0]["data"] == {"done": "s"}
    ran = [r for r in await records(alice) if r.capability == "job.run"]
    assert [(r.peer_id, r.decision, r.reason, r.task_id) for r in ran] == [
        (BOB, "allow", "OK", task_id)
    ]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_text_message_streams_to_a_text_capability(
    pki: Pki, alice: Agent, binding: str
) -> None:
    params = message_params("text.echo", None)
    params["message"]["parts"] = [{"text": "hi"}]
    async with https_client(pki, "bob") as client:
        seen = [event async for event in stream_of(client, alice, binding, params)]
    assert [summary(e) for e in seen] == [
        "task:SUBMITTED",
        "status:WORKING",
        "artifact:output",
        "status:COMPLETED",
    ]
    assert seen[2]["artifactUpdate"]["artifact"]["parts"][0]["data"] == {"text": "hi"}


async def test_a_refusal_before_the_first_event_is_the_bindings_error(
    pki: Pki, alice: Agent, gate: TaskGate
) -> None:
    before = len(await records(alice))
    params = message_params("job.run", {"tag": "x"})
    async with https_client(pki, "carol") as client:
        rpc = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendStreamingMessage", params, 9),
            headers=SSE_HEADERS,
        )
        rest = await client.post(
            alice.https_url + REST_PATH + "/message:stream", json=params, headers=SSE_HEADERS
        )
    assert rpc.headers["content-type"].startswith("application/json")
    error = rpc.json()["error"]
    assert (error["code"], our_reason(error["data"])) == (-32000, "CAPABILITY_NOT_GRANTED")
    assert rpc.json()["id"] == 9
    assert rest.status_code == 403
    assert our_reason(rest.json()["error"]["details"]) == "CAPABILITY_NOT_GRANTED"
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (spiffe("carol"), "refuse", "CAPABILITY_NOT_GRANTED")
    ] * 2
    assert gate.runs == 0


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_subscription_is_the_task_then_what_follows_ending_terminal(
    pki: Pki, alice: Agent, gate: TaskGate, binding: str
) -> None:
    seen: list[str] = []
    async with https_client(pki, "bob") as client:
        task_id = await background(client, alice, binding, gate)
        before = len(await records(alice))
        async with https_client(pki, "carol") as carol:  # another peer's task: as if none
            if binding == "jsonrpc":
                body = jsonrpc("SubscribeToTask", {"id": task_id}, 8)
                other = await carol.post(
                    alice.https_url + JSONRPC_PATH, json=body, headers=SSE_HEADERS
                )
            else:
                other = await carol.post(
                    f"{alice.https_url}{REST_PATH}/tasks/{task_id}:subscribe",
                    json={},
                    headers=SSE_HEADERS,
                )
        refused = (await records(alice))[before:]
        async for event in subscription(client, alice, binding, task_id):
            seen.append(summary(event))
            if len(seen) == 1:
                assert event["task"]["id"] == task_id
                gate.release.set()
    assert seen[0] == "task:WORKING"
    assert seen[-2:] == ["artifact:output", "status:COMPLETED"]
    assert other.headers["content-type"].startswith("application/json")  # an answer, not SSE
    if binding == "jsonrpc":
        error = other.json()["error"]
        assert (error["code"], our_reason(error["data"])) == (-32001, "TASK_NOT_FOUND")
    else:
        assert other.status_code == 404
        assert our_reason(other.json()["error"]["details"]) == "TASK_NOT_FOUND"
    assert [(r.peer_id, r.reason) for r in refused] == [(spiffe("carol"), "TASK_NOT_FOUND")]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_cancel_over_http_stops_the_capability_and_is_audited_with_the_canceller(
    pki: Pki, alice: Agent, gate: TaskGate, binding: str
) -> None:
    async with https_client(pki, "bob") as client:
        task_id = await background(client, alice, binding, gate)
        cancel = ("POST", f"/tasks/{task_id}:cancel")
        async with https_client(pki, "carol") as carol:  # not carol's: as if it did not exist
            refused = await call(carol, alice, binding, "CancelTask", {"id": task_id}, cancel)
        assert not gate.cancelled.is_set()
        canceled = task_of(
            await call(client, alice, binding, "CancelTask", {"id": task_id}, cancel), binding
        )
        again = await call(client, alice, binding, "CancelTask", {"id": task_id}, cancel)
    if binding == "jsonrpc":
        assert our_reason(refused.json()["error"]["data"]) == "TASK_NOT_FOUND"
        error = again.json()["error"]
        assert (error["code"], our_reason(error["data"])) == (-32002, "TASK_NOT_CANCELABLE")
    else:
        assert refused.status_code == 404
        assert our_reason(refused.json()["error"]["details"]) == "TASK_NOT_FOUND"
        assert again.status_code == 409  # the spec's 409 Conflict (A2A 1.0.0, 5.4)
        assert our_reason(again.json()["error"]["details"]) == "TASK_NOT_CANCELABLE"
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert canceled["status"]["message"]["metadata"]["a2agw.reason"] == "CANCELLED"
    assert gate.cancelled.is_set()  # the capability saw its CancelledError
    rows = await records(alice)
    ran = [r for r in rows if r.capability == "job.run"]
    assert [(r.decision, r.reason, r.peer_id, r.task_id, r.detail) for r in ran] == [
        ("allow", "CANCELLED", BOB, task_id, f"A2A CancelTask by {BOB}")
    ]
    refusals = [(r.peer_id, r.reason) for r in rows if r.decision == "refuse"]
    assert refusals == [(spiffe("carol"), "TASK_NOT_FOUND"), (BOB, "TASK_NOT_CANCELABLE")]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_the_sdk_client_streams_because_the_card_says_so(
    pki: Pki, alice: Agent, gate: TaskGate, binding: str
) -> None:
    from a2a.client import ClientConfig, ClientFactory
    from a2a.types import SendMessageRequest

    card = alice.public_card.get()
    assert card.capabilities.streaming
    request = json_format.ParseDict(message_params("job.run", {"tag": "sdk"}), SendMessageRequest())
    seen: list[str] = []
    async with https_client(pki, "bob") as http:
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
        client = ClientFactory(config).create(card)
        async for event in client.send_message(request):
            seen.append(summary(json_format.MessageToDict(event)))
            if seen[-1] == "artifact:chunks":
                gate.release.set()
    assert seen == [
        "task:SUBMITTED",
        "status:WORKING",
        "status:WORKING:halfway",
        "artifact:chunks",
        "artifact:output",
        "status:COMPLETED",
    ]
