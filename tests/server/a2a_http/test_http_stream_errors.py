"""An error after an SSE stream started is the binding's error, carrying our reason code.

alice follows a task whose row never changes (as if run by a process that
hangs): once its contract timeout and the lease sweep have passed (the row is
made old enough for that to be a second away) the subscription ends with
DEADLINE_EXCEEDED; when alice stops, a subscription
following a task run elsewhere ends with AGENT_STOPPING. On the wire the
last SSE event is ``event: error`` holding exactly the error body the edge
answers before a stream (JSON-RPC: the error response with our ErrorInfo in
``data`` and the message starting with the reason; REST: the
``google.rpc.Status`` form), and the real a2a-sdk client raises an error
carrying our reason code.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import SubscribeToTaskRequest

from gateway.runtime.agent import Agent
from gateway.server.a2a import task_follow
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.server.a2a_http.wire_errors import GATEWAY_REFUSAL_CODE
from tests.helpers.a2a_grpc import a2a_task
from tests.helpers.a2a_http import V1_HEADERS, https_client, jsonrpc
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    audit_rows,
    grant,
    spiffe,
)
from tests.helpers.task_capabilities import TaskGate

pytestmark = pytest.mark.slow

BOB = spiffe("bob")
SSE_HEADERS = {**V1_HEADERS, "Accept": "text/event-stream"}
TIMED_OUT = "DEADLINE_EXCEEDED: " + task_follow.TIMED_OUT


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    """alice serving HTTPS; bob may run the gate's jobs."""
    return await make_agent(
        grants=[grant("bob", ["job.brief"])], capabilities=TaskGate().capabilities(), https=True
    )


async def run_elsewhere(agent: Agent, task_id: str, *, bound_in: float = 1.0) -> None:
    """A WORKING ``job.brief`` (0.2 s timeout) row of bob's, leased by another live process,
    created so that its follow bound passes ``bound_in`` seconds from now."""
    now_ms = int(time.time() * 1000)
    created_ms = now_ms - int((0.2 + 1.0 + task_follow.SWEEP_SECONDS - bound_in) * 1000)
    task = a2a_task(task_id, BOB, "job.brief", created_ms=created_ms)
    await agent.a2a_tasks.save(task, "another-process", now_ms + 600_000)


async def raw_events(
    client: httpx.AsyncClient, agent: Agent, binding: str, task_id: str
) -> list[tuple[str, dict[str, Any]]]:
    """(event name, JSON data) of every SSE event of a SubscribeToTask, to the stream's end."""
    if binding == "jsonrpc":
        url, body = agent.https_url + JSONRPC_PATH, jsonrpc("SubscribeToTask", {"id": task_id}, 7)
    else:
        url, body = f"{agent.https_url}{REST_PATH}/tasks/{task_id}:subscribe", {}
    events: list[tuple[str, dict[str, Any]]] = []
    name = "message"
    async with client.stream("POST", url, json=body, headers=SSE_HEADERS) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[5:])))
                name = "message"
    return events


def our_info(reason: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "a2agw.v1",
        "metadata": {"a2agw.reason": reason},
    }


async def test_jsonrpc_stream_ends_with_a_jsonrpc_error_response_holding_our_reason(
    pki: Pki, alice: Agent
) -> None:
    await run_elsewhere(alice, "stuck-j")
    async with https_client(pki, "bob") as client:
        events = await raw_events(client, alice, "jsonrpc", "stuck-j")
    assert [name for name, _ in events] == ["message", "error"]
    assert events[0][1]["id"] == 7
    assert events[0][1]["result"]["task"]["id"] == "stuck-j"
    assert events[1][1] == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {
            "code": GATEWAY_REFUSAL_CODE,
            "message": TIMED_OUT,
            "data": [our_info("DEADLINE_EXCEEDED")],
        },
    }
    await alice.audit.flush()
    ended = [r for r in audit_rows(alice.config.audit_db) if r.reason == "DEADLINE_EXCEEDED"]
    assert [(r.decision, r.peer_id, r.detail) for r in ended] == [
        ("refuse", BOB, "A2A SubscribeToTask")
    ]
    assert alice.limit_stats().in_flight_total == 0


async def test_rest_stream_ends_with_the_specs_error_shape_holding_our_reason(
    pki: Pki, alice: Agent
) -> None:
    await run_elsewhere(alice, "stuck-r")
    async with https_client(pki, "bob") as client:
        events = await raw_events(client, alice, "rest", "stuck-r")
    assert [name for name, _ in events] == ["message", "error"]
    assert events[0][1]["task"]["id"] == "stuck-r"
    assert events[1][1] == {
        "error": {
            "code": 504,
            "status": "DEADLINE_EXCEEDED",
            "message": TIMED_OUT,
            "details": [our_info("DEADLINE_EXCEEDED")],
        }
    }
    assert alice.limit_stats().in_flight_total == 0


async def test_a_follow_cut_by_shutdown_ends_with_agent_stopping(pki: Pki, alice: Agent) -> None:
    await run_elsewhere(alice, "stuck-s", bound_in=600.0)  # only the shutdown ends it
    url = alice.https_url + JSONRPC_PATH
    body = jsonrpc("SubscribeToTask", {"id": "stuck-s"}, 8)
    seen: list[str] = []
    stopping: asyncio.Task[None] | None = None
    async with (
        https_client(pki, "bob") as client,
        client.stream("POST", url, json=body, headers=SSE_HEADERS) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                seen.append(event["error"]["message"] if "error" in event else "task")
                if len(seen) == 1:  # stop while the client reads on
                    stopping = asyncio.create_task(alice.stop())
    assert stopping is not None
    await stopping
    assert seen == ["task", "AGENT_STOPPING: " + task_follow.STOPPING]
    await alice.audit.flush()
    stopped = [r for r in audit_rows(alice.config.audit_db) if r.reason == "AGENT_STOPPING"]
    assert [(r.decision, r.peer_id, r.detail) for r in stopped] == [
        ("refuse", BOB, "A2A SubscribeToTask")
    ]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_the_sdk_client_raises_an_error_carrying_our_reason(
    pki: Pki, alice: Agent, binding: str
) -> None:
    task_id = "stuck-sdk-" + binding.replace("+", "-").lower()
    await run_elsewhere(alice, task_id)
    seen = []
    async with https_client(pki, "bob") as http:
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
        client = ClientFactory(config).create(alice.public_card.get())
        with pytest.raises(A2AClientError) as info:
            async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                seen.append(event.WhichOneof("payload"))
    assert seen == ["task"]
    # JSON-RPC: the SDK keeps the message of a code the spec does not define;
    # REST: the error body itself (no spec reason to map it to).
    if binding == "JSONRPC":
        assert str(info.value) == f"JSON-RPC Error {GATEWAY_REFUSAL_CODE}: {TIMED_OUT}"
    else:
        body = json.loads(str(info.value))
        assert body["error"]["message"] == TIMED_OUT
        assert body["error"]["details"] == [our_info("DEADLINE_EXCEEDED")]
