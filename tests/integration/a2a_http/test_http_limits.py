"""Rate and concurrency limits on the HTTP bindings hold before the body is read.

The edge takes the request's limit slot (one token of the peer's rate) before
it reads a byte of the body, and the servicer's pipeline adopts that slot
rather than taking a second token. The bodies refused here are not JSON: had
anything parsed them the answer would be INVALID_REQUEST, so RATE_LIMITED or
CONCURRENCY_LIMITED proves the refusal came first. Counts only, never timings:
rates are so low that no token refills during a test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.client.peer_client import PeerClient
from gateway.inbound.limits.refusal_log import LimitRefusalLog
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import (
    JSON_HEADERS,
    V1_HEADERS,
    https_client,
    jsonrpc,
    message_params,
    our_reason,
    serving_https,
)
from tests.limits.test_limits_served import NO_REFILL, refused_by_reason, until
from tests.support import (
    Pki,
    Probe,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    mesh_registry,
    spiffe,
    write_policy,
)

CAP = 2 * 1024 * 1024
GARBAGE = b"\xff{" * (512 * 1024)  # 1 MiB, under bob's body limit, and not JSON at all
BINDINGS = ["jsonrpc", "rest"]
Agents = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def serve(pki: Pki, tmp_path: Path) -> AsyncIterator[Agents]:
    """Starts alice on gRPC and HTTPS with bob's grant limited as asked; stops her after."""
    started: list[Agent] = []

    async def start(probe: Probe | None = None, **limits: Any) -> Agent:
        bob = {
            **grant(
                "bob", ["text.echo", "notes.write", "slow.wait", "relay.ask"], max_payload_bytes=CAP
            ),
            **limits,
        }
        policy = write_policy(tmp_path / "alice-policy.toml", [bob])
        config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "h")
        agent = Agent(config, mesh_registry(WriteCounter(), tmp_path / "alice-state", probe))
        await agent.start(watch_policy=False)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        await agent.stop()


def send_path(binding: str) -> str:
    return JSONRPC_PATH if binding == "jsonrpc" else REST_PATH + "/message:send"


def send_body(binding: str, capability: str, data: Any, **config: Any) -> dict[str, Any]:
    params = message_params(capability, data)
    if config:
        params["configuration"] = config
    return jsonrpc("SendMessage", params) if binding == "jsonrpc" else params


def reason_of(binding: str, response: httpx.Response) -> str:
    """Our reason code of a refusal, or the task's state of an answer."""
    body = response.json()
    if binding == "jsonrpc":
        if "error" in body:
            return our_reason(body["error"]["data"])
        body = body["result"]
    elif "error" in body:
        return our_reason(body["error"]["details"])
    state: str = (body.get("task") or body)["status"]["state"]
    return state


async def send(client: httpx.AsyncClient, agent: Agent, binding: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else None
    return await client.post(
        agent.https_url + send_path(binding),
        content=content,
        json=None if content is not None else body,
        headers=JSON_HEADERS,
    )


async def get_task(client: httpx.AsyncClient, agent: Agent, binding: str) -> httpx.Response:
    if binding == "jsonrpc":
        return await client.post(
            agent.https_url + JSONRPC_PATH,
            json=jsonrpc("GetTask", {"id": "no-such-task"}),
            headers=V1_HEADERS,
        )
    return await client.get(f"{agent.https_url}{REST_PATH}/tasks/no-such-task", headers=V1_HEADERS)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_an_empty_bucket_refuses_large_bodies_unread_and_audits_them_aggregated(
    pki: Pki, serve: Agents, binding: str
) -> None:
    agent = await serve(max_calls_per_second=NO_REFILL, burst=1)
    agent.handler.limit_refusals = LimitRefusalLog(agent.audit, interval=3600.0)
    async with https_client(pki, "bob") as client:
        first = await send(client, agent, binding, send_body(binding, "text.echo", {"text": "a"}))
        assert reason_of(binding, first) == "TASK_STATE_COMPLETED"  # the one token
        await agent.audit.flush()
        before = len(audit_rows(agent.config.audit_db))
        answers = [await send(client, agent, binding, GARBAGE) for _ in range(6)]
    assert [reason_of(binding, a) for a in answers] == ["RATE_LIMITED"] * 6
    if binding == "rest":
        assert {a.status_code for a in answers} == {429}
    await agent.audit.flush()
    rows = audit_rows(agent.config.audit_db)[before:]
    assert [(r.peer_id, r.reason, r.detail) for r in rows] == [
        (spiffe("bob"), "RATE_LIMITED", "count=1")
    ]
    assert agent.handler.limit_refusals.pending() == 5
    assert dict(agent.limit_stats().rate_limited) == {spiffe("bob"): 6}
    assert agent.limit_stats().in_flight_total == 0
    await agent.stop()  # writes the counts
    assert refused_by_reason(agent, "bob") == {"RATE_LIMITED": 6}


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_request_takes_exactly_one_token(pki: Pki, serve: Agents, binding: str) -> None:
    agent = await serve(max_calls_per_second=NO_REFILL, burst=2)
    async with https_client(pki, "bob") as client:
        sent = await send(client, agent, binding, send_body(binding, "text.echo", {"text": "a"}))
        polled = await get_task(client, agent, binding)
        third = await send(client, agent, binding, send_body(binding, "text.echo", {"text": "b"}))
    assert [reason_of(binding, sent), reason_of(binding, polled), reason_of(binding, third)] == [
        "TASK_STATE_COMPLETED",
        "TASK_NOT_FOUND",
        "RATE_LIMITED",
    ]
    assert dict(agent.limit_stats().rate_limited) == {spiffe("bob"): 1}
    assert agent.limit_stats().in_flight_total == 0


async def test_a_held_call_makes_a_rest_send_concurrency_limited_before_parsing(
    pki: Pki, serve: Agents
) -> None:
    probe = Probe()
    agent = await serve(probe, max_in_flight=1)
    async with (
        PeerClient(agent.config.id, agent.address, pki.material("bob")) as grpc_bob,
        https_client(pki, "bob") as client,
    ):
        held = asyncio.create_task(grpc_bob.invoke("slow.wait", {}))
        await until(lambda: probe.waits == 1, "the held call")
        rest = await send(client, agent, "rest", GARBAGE)  # not JSON: never parsed
        # A JSON-RPC request names its method in the body: the edge takes a poll's
        # slot (its token), and the room is checked once the method is known.
        rpc = await send(client, agent, "jsonrpc", send_body("jsonrpc", "text.echo", {"t": 1}))
        # Polls need no room under max_in_flight, on either binding.
        polls = [await get_task(client, agent, binding) for binding in BINDINGS]
        assert agent.limit_stats().in_flight_total == 1  # the held call only
        probe.release.set()
        await held
    assert reason_of("rest", rest) == "CONCURRENCY_LIMITED"
    assert reason_of("jsonrpc", rpc) == "CONCURRENCY_LIMITED"
    assert [reason_of(b, p) for b, p in zip(BINDINGS, polls, strict=True)] == ["TASK_NOT_FOUND"] * 2
    assert dict(agent.limit_stats().concurrency_limited) == {spiffe("bob"): 2}
    assert agent.limit_stats().in_flight_total == 0


@pytest.mark.parametrize("binding", BINDINGS)
async def test_the_slot_is_given_back_exactly_once_however_the_request_ends(
    pki: Pki, serve: Agents, binding: str
) -> None:
    probe = Probe()
    agent = await serve(probe)
    async with (
        PeerClient(agent.config.id, agent.address, pki.material("bob")) as grpc_bob,
        https_client(pki, "bob") as client,
    ):
        # A held call keeps one place: a second release of any slot below would
        # take the count under it.
        held = asyncio.create_task(grpc_bob.invoke("slow.wait", {}))
        await until(lambda: probe.waits == 1, "the held call")
        outcomes = [
            await send(client, agent, binding, send_body(binding, "kv.get", {"key": "a"})),
            await send(client, agent, binding, send_body(binding, "notes.write", {"no": 1})),
            await send(client, agent, binding, b"{not json"),
            await send(
                client, agent, binding, send_body(binding, "relay.ask", {"peer": spiffe("zed")})
            ),
            await get_task(client, agent, binding),
        ]
        assert agent.limit_stats().in_flight_total == 1
        probe.release.set()
        await held
    assert [reason_of(binding, o) for o in outcomes] == [
        "CAPABILITY_NOT_GRANTED",
        "INVALID_INPUT",
        "INVALID_REQUEST",
        "TASK_STATE_FAILED",
        "TASK_NOT_FOUND",
    ]
    assert agent.limit_stats().in_flight_total == 0


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_background_task_and_a_subscription_hold_their_slot_while_open(
    pki: Pki, serve: Agents, binding: str
) -> None:
    probe = Probe()
    agent = await serve(probe)
    async with https_client(pki, "bob") as client:
        started = await send(
            client,
            agent,
            binding,
            send_body(binding, "slow.wait", {}, returnImmediately=True),
        )
        body = started.json()
        task_id = (body["result"] if binding == "jsonrpc" else body)["task"]["id"]
        await until(lambda: probe.waits == 1, "the background task")
        assert agent.limit_stats().in_flight_total == 1  # the task's, not the request's
        if binding == "jsonrpc":
            subscribe = client.stream(
                "POST",
                agent.https_url + JSONRPC_PATH,
                json=jsonrpc("SubscribeToTask", {"id": task_id}),
                headers={**V1_HEADERS, "Accept": "text/event-stream"},
            )
        else:
            subscribe = client.stream(
                "POST",
                f"{agent.https_url}{REST_PATH}/tasks/{task_id}:subscribe",
                headers={**V1_HEADERS, "Accept": "text/event-stream"},
            )
        async with subscribe as stream:
            assert stream.status_code == 200
            lines = stream.aiter_lines()
            while not (await anext(lines)).startswith("data:"):
                pass
            assert agent.limit_stats().in_flight_total == 2  # task and subscription
            probe.release.set()
            async for _ in lines:
                pass
    await until(lambda: agent.limit_stats().in_flight_total == 0, "every slot back")
