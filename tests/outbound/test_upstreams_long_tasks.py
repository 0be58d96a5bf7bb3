"""A fronted upstream's long-running task: followed, not held on one call; cancel forwarded.

alice (a2a-sdk client) → bob (gateway, A2A background task) → legacy (a2a-sdk
agent behind ``[[upstreams]]``). bob sends with ``return_immediately`` and
polls the upstream task; its status text reaches alice's task as progress;
alice's CancelTask on bob cancels the upstream task too. A streaming upstream
(gRPC, or JSON-RPC over SSE) has its events passed through to a streaming
caller; a JSON-RPC stream event that is not A2A, or too large, is
INVALID_OUTPUT and cuts the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from gateway.runtime.agent import Agent
from gateway.transport.tls import MESSAGE_CEILING
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, output_of
from tests.helpers.a2a_upstream import SdkAgent, grpc_upstream, jsonrpc_upstream
from tests.helpers.agents import Pki, spiffe
from tests.helpers.fronting import LEGACY, fronted, outcome, records

WORKING = a2a_pb2.TASK_STATE_WORKING


@pytest.fixture
async def legacy() -> SdkAgent:
    return SdkAgent(mode="progress")


@pytest.fixture
async def bob(pki: Pki, tmp_path: Path, legacy: SdkAgent) -> AsyncIterator[Agent]:
    async with grpc_upstream(legacy, pki, "legacy") as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up, timeout=30.0) as agent:
            yield agent


def background(text: str) -> a2a_pb2.SendMessageRequest:
    request = data_request("legacy.echo", {"text": text})
    request.configuration.return_immediately = True
    return request


async def _until(alice: A2APeer, task_id: str, done: object) -> a2a_pb2.Task:
    for _ in range(400):  # bounded: 20 s
        task = await alice.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        if done(task):  # type: ignore[operator]
            return task
        await asyncio.sleep(0.05)
    raise AssertionError("the task never got there")


async def test_a_long_upstream_task_is_followed_and_its_progress_shown(
    pki: Pki, bob: Agent, legacy: SdkAgent
) -> None:
    async with A2APeer(pki, bob, "alice") as alice:
        task = await alice.send(background("slowly"))
        working = await _until(
            alice, task.id, lambda t: t.status.message.parts and t.status.state == WORKING
        )
        assert working.status.state == a2a_pb2.TASK_STATE_WORKING
        assert working.status.message.parts[0].text == "waiting for release"
        legacy.release.set()
        done = await _until(alice, task.id, lambda t: t.status.state != WORKING)
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert output_of(done) == {"text": "echo: slowly"}
    assert legacy.cancelled == 0
    assert [outcome(r) for r in await records(bob)] == [
        (spiffe("alice"), "legacy.echo", "allow", "OK")
    ]


async def test_cancel_task_on_the_gateway_cancels_the_upstream_task(
    pki: Pki, bob: Agent, legacy: SdkAgent
) -> None:
    async with A2APeer(pki, bob, "alice") as alice:
        task = await alice.send(background("stop me"))
        await _until(alice, task.id, lambda t: t.status.message.parts and t.status.state == WORKING)
        canceled = await alice.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
    assert legacy.cancelled == 1
    rows = await records(bob)
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.echo", "allow", "CANCELLED")]
    assert rows[0].detail == f"A2A CancelTask by {spiffe('alice')}"


@contextlib.asynccontextmanager
async def streaming_upstream(
    legacy: SdkAgent, pki: Pki, binding: str
) -> AsyncIterator[dict[str, object]]:
    """legacy served over ``binding`` with mTLS, as an ``[[upstreams]]`` entry that streams."""
    if binding == "grpc":
        async with grpc_upstream(legacy, pki, "legacy") as address:
            yield {"id": LEGACY, "binding": "grpc", "address": address, "streaming": True}
    else:
        async with jsonrpc_upstream(legacy, pki, "legacy") as url:
            yield {"id": LEGACY, "binding": "jsonrpc", "url": url, "streaming": True}


@pytest.mark.parametrize("binding", ["grpc", "jsonrpc"])
async def test_a_streaming_upstream_passes_its_events_through_to_a_streaming_caller(
    pki: Pki, tmp_path: Path, binding: str
) -> None:
    legacy = SdkAgent(mode="stream")
    async with streaming_upstream(legacy, pki, binding) as up:
        async with fronted(pki, tmp_path, up, timeout=30.0) as bob:
            async with A2APeer(pki, bob, "alice") as alice:
                call = alice.stub.SendStreamingMessage(
                    data_request("legacy.echo", {"text": "live"}), metadata=V1, timeout=30
                )
                seen = [event async for event in call]
                # Not followed (blocking SendMessage): one message, the same answer.
                blocking = await alice.send(data_request("legacy.echo", {"text": "once"}))
            rows = await records(bob)
    kinds = [event.WhichOneof("payload") for event in seen]
    assert kinds == [
        "task",
        "status_update",  # WORKING (ours)
        "status_update",  # "streaming", the upstream's status text
        "artifact_update",
        "artifact_update",
        "artifact_update",  # the output, checked against the contract
        "status_update",
    ]
    assert seen[2].status_update.status.message.parts[0].text == "streaming"
    chunks = [
        json_format.MessageToDict(e.artifact_update.artifact.parts[0].data) for e in seen[3:5]
    ]
    assert chunks == [{"text": "chunk 1"}, {"text": "chunk 2"}]
    output = json_format.MessageToDict(seen[5].artifact_update.artifact.parts[0].data)
    assert output == {"text": "chunk 1chunk 2echo: live"}
    assert seen[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert output_of(blocking) == {"text": "chunk 1chunk 2echo: once"}
    assert [outcome(r) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "OK"),
        (spiffe("alice"), "legacy.echo", "allow", "OK"),
    ]


def _sse(*events: object) -> list[bytes]:
    return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events]


_WORKING = {
    "jsonrpc": "2.0",
    "id": 1,
    "result": {"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}},
}


@pytest.mark.parametrize(
    "stream",
    [
        _sse(_WORKING, {"jsonrpc": "2.0", "id": 1, "result": {"oops": {}}}),  # not A2A
        [*_sse(_WORKING), b"data: <html>not json</html>\n\n"],
        [*_sse(_WORKING), b"data: " + b"x" * (MESSAGE_CEILING + 1)],  # never finishes its event
    ],
    ids=["not-a-stream-event", "not-json", "over-the-ceiling"],
)
async def test_a_jsonrpc_stream_event_that_is_not_a2a_is_invalid_output(
    pki: Pki, tmp_path: Path, stream: list[bytes]
) -> None:
    async with jsonrpc_upstream(SdkAgent(), pki, "legacy", sse=stream) as url:
        up = {"id": LEGACY, "binding": "jsonrpc", "url": url, "streaming": True}
        async with fronted(pki, tmp_path, up, timeout=30.0) as bob:
            async with A2APeer(pki, bob, "alice") as alice:
                call = alice.stub.SendStreamingMessage(
                    data_request("legacy.echo", {"text": "x"}), metadata=V1, timeout=30
                )
                seen = [event async for event in call]
            rows = await records(bob)
    last = seen[-1].status_update.status
    assert last.state == a2a_pb2.TASK_STATE_FAILED
    assert last.message.metadata["a2agw.reason"] == "INVALID_OUTPUT"
    assert [outcome(r) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "INVALID_OUTPUT")
    ]
