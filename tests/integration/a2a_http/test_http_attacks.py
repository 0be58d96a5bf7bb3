"""What an attacker tries on the HTTPS port, beyond what a client library would send.

Each case found a defect before its fix: a method no route lists answered
``405`` by the router (no certificate needed, nothing audited), and a target
that is not a path (``*``, ``host:port``, an absolute URL) ``404`` by it; a 0.3 REST
stream whose body the SDK cannot parse answered ``500`` (unaudited, the body
quoted in the log's traceback); a body that never finished held its
connection for ever; JSON nested past the recursion limit answered the SDK's
internal error with its exception text; a body cut off (invalid chunked
encoding, or the connection closed mid-body) escaped the edge as an
exception (unaudited, a traceback at ERROR). Cases that held already stay as
regression tests: the SDK's parse message quotes the body to its sender, never
into the audit record; a client that hangs up mid-stream frees its place and
the task runs on; an identity claimed in a 0.3 request is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.audit.record import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH, edge
from tests.a2a_http_support import (
    JSON_HEADERS,
    V1_HEADERS,
    client_context,
    https_client,
    jsonrpc,
    message_params,
    our_reason,
    serving_https,
)
from tests.limits.test_limits_served import until
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

BOB = spiffe("bob")
CAROL = spiffe("carol")
SECRET = "s3cr3t-payload-7f1c"
"""A value only the request body holds: it must not reach the audit log."""
ODD_METHODS = ["OPTIONS", "TRACE", "PROPFIND", "CONNECT"]
PATHS = [JSONRPC_PATH, REST_PATH + "/message:send", REST_PATH + "/t1/tasks/x", "/nowhere"]


async def records(agent: Agent) -> list[AuditRecord]:
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


async def still_serving(pki: Pki, agent: Agent) -> None:
    """The agent answers the next call: nothing crashed."""
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            agent.https_url + JSONRPC_PATH,
            json=jsonrpc("ListTasks", {}),
            headers=V1_HEADERS,
        )
    assert (answer.status_code, "result" in answer.json()) == (200, True)


def assert_rest_refusal(response: httpx.Response, reason: str, status: int) -> None:
    error = response.json()["error"]
    assert (response.status_code, error["code"], our_reason(error["details"])) == (
        status,
        status,
        reason,
    )
    assert error["message"].startswith(f"{reason}: ")


@pytest.mark.parametrize("method", ODD_METHODS)
@pytest.mark.parametrize("path", PATHS)
async def test_any_method_without_a_certificate_is_unauthenticated_and_audited(
    pki: Pki, alice: Agent, method: str, path: str
) -> None:
    before = len(await records(alice))
    async with https_client(pki, None) as client:
        response = await client.request(method, alice.https_url + path, headers=V1_HEADERS)
    # An HTTP status even on the JSON-RPC path: a 2xx answer to CONNECT opens a tunnel.
    assert_rest_refusal(response, "UNAUTHENTICATED", 401)
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [("", "refuse", "UNAUTHENTICATED")]


@pytest.mark.parametrize("method", ODD_METHODS)
async def test_any_method_a_route_does_not_serve_is_invalid_request_audited(
    pki: Pki, alice: Agent, method: str
) -> None:
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        for path in PATHS:
            response = await client.request(method, alice.https_url + path)
            assert_rest_refusal(response, "INVALID_REQUEST", 404)
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.reason) for r in added] == [(BOB, "INVALID_REQUEST")] * len(PATHS)
    await still_serving(pki, alice)


NON_ORIGIN_TARGETS = [
    "OPTIONS *",
    "CONNECT 127.0.0.1:22",
    "POST https://localhost/a2a/jsonrpc",
    "GET a2a/rest/tasks",
]


@pytest.mark.parametrize("caller", [None, "bob"])
@pytest.mark.parametrize("target", NON_ORIGIN_TARGETS)
async def test_a_target_that_is_not_a_path_is_refused_and_audited(
    pki: Pki, alice: Agent, counter: WriteCounter, caller: str | None, target: str
) -> None:
    # Found by an attack round: uvicorn passes such a target on as the path, no
    # route matches it, and the router answered "404 Not Found" itself, with or
    # without a certificate, unaudited.
    before = len(await records(alice))
    port = int(alice.https_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection(
        "localhost", port, ssl=client_context(pki, caller), server_hostname="localhost"
    )
    try:
        writer.write(f"{target} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        error = json.loads(await asyncio.wait_for(reader.readexactly(length), 20))["error"]
    finally:
        writer.close()
    reason, status = ("UNAUTHENTICATED", 401) if caller is None else ("INVALID_REQUEST", 404)
    assert (head.split(b" ")[1], error["code"], our_reason(error["details"])) == (
        str(status).encode(),
        status,
        reason,
    )
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (BOB if caller else "", "refuse", reason)
    ]
    assert counter.calls == 0


@pytest.mark.parametrize(
    "body",
    [
        b'{"message": 5}',
        b"not json",
        b"[]",
        b'{"message": {"content": [{"data": {"data": "' + SECRET.encode() + b'"}}]}}',
    ],
)
async def test_a_0_3_rest_stream_the_sdk_cannot_parse_is_invalid_request_audited(
    pki: Pki, alice: Agent, counter: WriteCounter, body: bytes
) -> None:
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        response = await client.post(
            alice.https_url + REST_PATH + "/v1/message:stream",
            content=body,
            headers={"content-type": "application/json"},
        )
    assert_rest_refusal(response, "INVALID_REQUEST", 400)
    assert SECRET not in response.text
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (BOB, "refuse", "INVALID_REQUEST")
    ]
    assert counter.calls == 0
    await still_serving(pki, alice)


async def test_the_audit_never_holds_what_the_sdk_quoted_from_the_body(
    pki: Pki, alice: Agent
) -> None:
    # Metadata that is not an object: the SDK's parse error quotes its value.
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [], "metadata": SECRET}
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        rest = await client.post(
            alice.https_url + REST_PATH + "/message:send",
            json={"message": message},
            headers=V1_HEADERS,
        )
        rpc = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendMessage", {"message": message}),
            headers=V1_HEADERS,
        )
    assert_rest_refusal(rest, "INVALID_REQUEST", 400)
    assert our_reason(rpc.json()["error"]["data"]) == "INVALID_REQUEST"
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.reason) for r in added] == [(BOB, "INVALID_REQUEST")] * 2
    for record in added:
        assert not any(SECRET in str(field) for field in astuple(record)), record


@contextlib.asynccontextmanager
async def bob_connection(
    pki: Pki, agent: Agent
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A fresh TLS connection to ``agent``'s HTTPS port as bob, closed on exit."""
    port = int(agent.https_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection(
        "localhost", port, ssl=client_context(pki, "bob"), server_hostname="localhost"
    )
    try:
        yield reader, writer
    finally:
        writer.close()


async def send_without_finishing(pki: Pki, agent: Agent, path: str) -> bytes:
    """Headers announcing 1000 bytes, then 10 of them; what the agent answers."""
    async with bob_connection(pki, agent) as (reader, writer):
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            "A2A-Version: 1.0\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"jsonrpc"'
        )
        await writer.drain()
        # Bounded: the old edge waited for the rest of the body for ever.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        return head + await asyncio.wait_for(reader.readexactly(length), 20)


@pytest.mark.parametrize("path", [JSONRPC_PATH, REST_PATH + "/message:send"])
async def test_a_body_that_never_finishes_is_deadline_exceeded_audited(
    pki: Pki, alice: Agent, counter: WriteCounter, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(edge, "BODY_SECONDS", 0.5, raising=False)
    before = len(await records(alice))
    answer = await send_without_finishing(pki, alice, path)
    head, _, body = answer.partition(b"\r\n\r\n")
    error = json.loads(body)["error"]
    if path == JSONRPC_PATH:
        assert (head.split(b" ")[1], our_reason(error["data"])) == (b"200", "DEADLINE_EXCEEDED")
    else:
        assert (head.split(b" ")[1], our_reason(error["details"])) == (b"504", "DEADLINE_EXCEEDED")
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (BOB, "refuse", "DEADLINE_EXCEEDED")
    ]
    assert counter.calls == 0
    await still_serving(pki, alice)


async def send_raw(pki: Pki, agent: Agent, raw: bytes, *, close: bool) -> bytes:
    """Write ``raw`` on a fresh TLS connection as bob, closing it at once if ``close``;
    what the agent answers (nothing when it could not)."""
    async with bob_connection(pki, agent) as (reader, writer):
        writer.write(raw)
        await writer.drain()
        if close:
            return b""
        return await asyncio.wait_for(reader.read(65536), 20)


CUT_OFF_BODIES = {
    "invalid chunked encoding": (
        b"Transfer-Encoding: chunked\r\n\r\nzz-not-a-chunk-size\r\n",
        False,
    ),
    "connection closed mid-body": (b"Content-Length: 1000\r\n\r\n" + b'{"jsonrpc"', True),
}


@pytest.mark.parametrize("case", sorted(CUT_OFF_BODIES))
@pytest.mark.parametrize("path", [JSONRPC_PATH, REST_PATH + "/message:send"])
async def test_a_body_cut_off_is_invalid_request_audited_without_a_traceback(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    caplog: pytest.LogCaptureFixture,
    path: str,
    case: str,
) -> None:
    # Found by an attack round: uvicorn ends such a body with ClientDisconnect,
    # which escaped the edge (nothing audited, "Exception in ASGI application" and
    # its traceback at ERROR).
    tail, close = CUT_OFF_BODIES[case]
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "A2A-Version: 1.0\r\n"
    ).encode()
    before = len(await records(alice))
    with caplog.at_level(logging.WARNING):
        answer = await send_raw(pki, alice, head + tail, close=close)
        await until(lambda: len(audit_rows(alice.config.audit_db)) > before, "its record")
    if not close:
        assert answer.startswith(b"HTTP/1.1 400 ")  # uvicorn's own answer to the bad chunk
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (BOB, "refuse", "INVALID_REQUEST")
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert counter.calls == 0
    await still_serving(pki, alice)


@pytest.fixture
async def slow_alice(pki: Pki, tmp_path: Path) -> AsyncIterator[tuple[Agent, Probe]]:
    """alice on HTTPS with bob granted ``slow.wait`` (it waits for the probe's release)."""
    probe = Probe()
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["slow.wait"])])
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "h")
    agent = Agent(config, mesh_registry(WriteCounter(), tmp_path / "alice-state", probe))
    await agent.start(watch_policy=False)
    yield agent, probe
    await agent.stop()


async def first_event_then_hang_up(
    client: httpx.AsyncClient, agent: Agent, binding: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """Open ``method``'s SSE stream, read its first event, and drop the connection."""
    if binding == "jsonrpc":
        url, body = agent.https_url + JSONRPC_PATH, jsonrpc(method, params)
    elif method == "SendStreamingMessage":
        url, body = agent.https_url + REST_PATH + "/message:stream", params
    else:
        url, body = f"{agent.https_url}{REST_PATH}/tasks/{params['id']}:subscribe", None
    headers = {**V1_HEADERS, "Accept": "text/event-stream"}
    async with client.stream("POST", url, json=body, headers=headers) as stream:
        assert stream.status_code == 200
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                first: dict[str, Any] = json.loads(line[5:])
                return first.get("result", first)
    raise AssertionError("the stream ended without an event")


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_client_that_hangs_up_mid_stream_frees_its_place_and_the_task_runs_on(
    pki: Pki, slow_alice: tuple[Agent, Probe], binding: str
) -> None:
    agent, probe = slow_alice
    params = message_params("slow.wait", {})
    async with https_client(pki, "bob") as client:
        first = await first_event_then_hang_up(
            client, agent, binding, "SendStreamingMessage", params
        )
    task_id = first["task"]["id"]
    await until(lambda: probe.waits == 1, "the streamed task")
    await until(lambda: agent.limit_stats().in_flight_total == 1, "the task's place only")
    async with https_client(pki, "bob") as client:
        await first_event_then_hang_up(client, agent, binding, "SubscribeToTask", {"id": task_id})
        await until(lambda: agent.limit_stats().in_flight_total == 1, "the subscription's back")
        probe.release.set()
        await until(lambda: agent.limit_stats().in_flight_total == 0, "every place back")
        got = await client.post(
            agent.https_url + JSONRPC_PATH,
            json=jsonrpc("GetTask", {"id": task_id}),
            headers=V1_HEADERS,
        )
    assert got.json()["result"]["status"]["state"] == "TASK_STATE_COMPLETED"


DEEP = b"[" * 30000 + b"]" * 30000
"""Nested past Python's recursion limit, and within bob's body limit."""


async def test_json_nested_past_the_recursion_limit_is_invalid_request_without_its_text(
    pki: Pki, alice: Agent
) -> None:
    message = b'{"messageId": "m", "role": "ROLE_USER", "parts": [{"data": ' + DEEP + b"}]}"
    in_params = b'{"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": '
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        answers = [
            await client.post(alice.https_url + JSONRPC_PATH, content=body, headers=JSON_HEADERS)
            for body in (DEEP, in_params + message + b"}}")
        ]
    for answer in answers:
        error = answer.json()["error"]
        assert (answer.status_code, error["code"]) == (200, -32600)
        assert our_reason(error["data"]) == "INVALID_REQUEST"
        assert "recursion" not in answer.text
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.reason) for r in added] == [(BOB, "INVALID_REQUEST")] * 2
    await still_serving(pki, alice)


def v0_3_send(meta: dict[str, Any], params_meta: dict[str, Any] | None, *, rest: bool) -> Any:
    """A 0.3 ``message/send`` params object (JSON-RPC) or REST body, writing ``notes.write``."""
    meta = {"a2agw.capability": "notes.write", **meta}
    if rest:
        content = [{"data": {"data": {"note": "n"}}}]
        message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "content": content}
    else:
        parts = [{"kind": "data", "data": {"note": "n"}}]
        message = {
            "kind": "message",
            "messageId": str(uuid.uuid4()),
            "role": "user",
            "parts": parts,
        }
    params: dict[str, Any] = {"message": {**message, "metadata": meta}}
    if params_meta is not None:
        params["metadata"] = params_meta
    return params


@pytest.mark.parametrize(
    ("meta", "params_meta"),
    [({"a2agw.peer": CAROL}, None), ({"a2agw.spiffe_id": 5}, None), ({}, {"a2agw.identity": "x"})],
)
@pytest.mark.parametrize(
    "kind", ["message/send", "message/stream", "v1/message:send", "v1/message:stream"]
)
async def test_an_identity_claimed_in_a_0_3_request_is_refused_and_nothing_runs(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    kind: str,
    meta: dict[str, Any],
    params_meta: dict[str, Any] | None,
) -> None:
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        if kind.startswith("v1/"):
            answer = await client.post(
                f"{alice.https_url}{REST_PATH}/{kind}", json=v0_3_send(meta, params_meta, rest=True)
            )
            assert_rest_refusal(answer, "UNAUTHENTICATED", 401)
        else:
            body = {"jsonrpc": "2.0", "id": 1, "method": kind}
            answer = await client.post(
                alice.https_url + JSONRPC_PATH,
                json={**body, "params": v0_3_send(meta, params_meta, rest=False)},
            )
            assert answer.json()["error"]["data"]["reason"] == "UNAUTHENTICATED"  # the 0.3 form
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.reason) for r in added] == [(BOB, "UNAUTHENTICATED")]
    assert counter.calls == 0


PROXY_IDENTITY_HEADERS = [
    "Proxy-Authorization",
    "X-Forwarded-Tls-Client-Cert",
    "X-Amzn-Mtls-Clientcert",
    "X-ARR-ClientCert",
    "X-SSL-Client-DN",
    "X-SSL-Client-Verify",
    "Remote-User",
    "X-Forwarded-User",
    "X-Auth-Request-Email",
]


@pytest.mark.parametrize("header", PROXY_IDENTITY_HEADERS)
async def test_an_identity_a_proxy_would_add_is_refused_before_the_body_is_read(
    pki: Pki, alice: Agent, counter: WriteCounter, header: str
) -> None:
    body = jsonrpc("SendMessage", message_params("notes.write", {"note": "n"}))
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=body,
            headers={**V1_HEADERS, header: CAROL},
        )
    error = answer.json()["error"]
    assert our_reason(error["data"]) == "UNAUTHENTICATED"
    assert error["message"].endswith(f"remove the header {header.lower()}")
    added = (await records(alice))[before:]
    assert [(r.peer_id, r.reason) for r in added] == [(BOB, "UNAUTHENTICATED")]
    assert counter.calls == 0
