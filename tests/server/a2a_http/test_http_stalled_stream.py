"""A client that stops reading an SSE stream: the stream ends after ``[a2a] stream_send_timeout``.

Before the fix such a stream stayed open for ever after its task had ended
and given back its place: a reader that paused and resumed later received
every byte of a multi-megabyte output, so paused streams were bounded by
nothing and each held its output in the server's buffers. Here bob opens a
stream of a large output on a socket with a small receive buffer, reads the
first event and stops reading: the server's write then waits on a full
buffer, and the stream is ended (the connection dropped) once a write has
waited ``stream_send_timeout`` seconds. A streamed task's place is the
task's (given back when it ends, the stream still stalled); a subscription's
is its stream's, held while it stalls and given back when it is ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from capabilities import CallContext, ContractModel, capability
from gateway.audit.record import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from policies.grants import MAX_PAYLOAD_CEILING
from tests.helpers.a2a_http import (
    V1_HEADERS,
    client_context,
    https_client,
    jsonrpc,
    message_params,
    still_serving,
)
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    audit_rows,
    grant,
    spiffe,
)
from tests.helpers.waiting import until

pytestmark = pytest.mark.slow

BOB = spiffe("bob")
SEND_TIMEOUT = 1.0
CHUNKS, CHUNK = 3, 1_200_000
OUTPUT = 3_500_000
"""What ``big.output`` streams: more than the buffers between the server and a client that
does not read (loopback grows the server's send buffer to 4 MiB, which would take a 1 MB
output whole), and within bob's 4 MiB payload cap."""


class Size(ContractModel):
    """Nothing: the sizes are the test's."""


class Text(ContractModel):
    """A long text."""

    text: str


async def streamed(ctx: CallContext) -> Text:
    """Stream CHUNKS chunks of CHUNK characters, then return OUTPUT characters."""
    for _ in range(CHUNKS):
        await ctx.emit_chunk({"text": "x" * CHUNK})
    return Text(text="x" * OUTPUT)


@capability("big.output", "1.0.0", risk="read", timeout=30.0, idempotent=True)
async def big_output(inp: Size, ctx: CallContext) -> Text:
    """A large output, streamed."""
    return await streamed(ctx)


EDGE_LOGGER = "gateway.server.a2a_http.edge"


class Gate:
    """Lets ``big.later`` go on (a new event per test: an event belongs to one loop)."""

    release = asyncio.Event()


@capability("big.later", "1.0.0", risk="read", timeout=30.0, idempotent=True)
async def big_later(inp: Size, ctx: CallContext) -> Text:
    """``big.output``, once the gate is open."""
    await Gate.release.wait()
    return await streamed(ctx)


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` at WARNING, uvicorn's own log included (it propagates to the root)."""
    caplog.set_level(logging.WARNING)
    yield caplog


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    """alice on HTTPS, bob granted ``big.output`` and ``text.echo``, streams' writes bounded to 1 s."""
    return await make_agent(
        grants=[
            grant(
                "bob",
                ["big.output", "big.later", "text.echo"],
                max_payload_bytes=MAX_PAYLOAD_CEILING,
            )
        ],
        capabilities=[big_output, big_later],
        https=True,
        a2a={"stream_send_timeout": SEND_TIMEOUT},
    )


def open_stream(pki: Pki, agent: Agent, binding: str, task_id: str | None = None) -> ssl.SSLSocket:
    """bob's blocking HTTPS socket (4 KiB receive buffer) with a request for a stream sent:
    a streamed ``big.output``, or (``task_id``) a subscription to that task."""
    url = urlsplit(agent.https_url)
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    raw.settimeout(10)
    raw.connect(("127.0.0.1", url.port or 443))
    sock = client_context(pki, "bob").wrap_socket(raw, server_hostname=url.hostname)
    params = message_params("big.output", {})
    body: dict[str, object] | None
    if binding == "jsonrpc" and task_id is not None:
        path, body = JSONRPC_PATH, jsonrpc("SubscribeToTask", {"id": task_id})
    elif binding == "jsonrpc":
        path, body = JSONRPC_PATH, jsonrpc("SendStreamingMessage", params)
    elif task_id is not None:
        path, body = f"{REST_PATH}/tasks/{task_id}:subscribe", None
    else:
        path, body = REST_PATH + "/message:stream", params
    data = json.dumps(body).encode() if body is not None else b""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nA2A-Version: 1.0\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def read_first_event(sock: ssl.SSLSocket) -> bytes:
    """What arrived up to the end of the stream's first event (its task), read in small pieces."""
    got = b""
    while b"\r\n\r\n" not in got.partition(b"data:")[2]:
        chunk = sock.recv(1024)
        assert chunk, f"the connection ended before the first event: {got[:300]!r}"
        got += chunk
    return got


def read_to_the_end(sock: ssl.SSLSocket) -> bytes:
    """Whatever the client still gets once it reads again, until the connection or stream ends."""
    got = b""
    try:
        while not got.endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(65536)):
            got += chunk
    except (ConnectionResetError, ssl.SSLError, OSError):
        pass
    return got


async def records(agent: Agent) -> list[AuditRecord]:
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_stream_whose_client_stops_reading_ends_and_the_agent_serves_on(
    pki: Pki, alice: Agent, binding: str, server_log: pytest.LogCaptureFixture
) -> None:
    caplog = server_log
    before = len(await records(alice))
    sock = await asyncio.to_thread(open_stream, pki, alice, binding)
    try:
        first = await asyncio.to_thread(read_first_event, sock)
        assert first.startswith(b"HTTP/1.1 200 ")
        # bob reads no more; the server's writes wait, and the stream ends.
        await until(
            lambda: any(r.name == EDGE_LOGGER for r in caplog.records), "the stalled stream's end"
        )
        [ended] = [r for r in caplog.records if r.name == EDGE_LOGGER]
        assert ended.getMessage() == (
            f"ended the A2A {'JSON-RPC' if binding == 'jsonrpc' else 'SendStreamingMessage'} "
            f"stream of {BOB}: its client read nothing for {SEND_TIMEOUT:g} s"
        )
        rest = await asyncio.to_thread(read_to_the_end, sock)
    finally:
        sock.close()
    # Cut short: neither the whole output nor the terminal event ever reached bob.
    assert len(first + rest) < CHUNKS * CHUNK + OUTPUT
    assert b"TASK_STATE_COMPLETED" not in first + rest
    # The task ran to its end, was audited once as the call it was, and holds no place.
    assert alice.limit_stats().in_flight_total == 0
    added = [
        (r.peer_id, r.capability, r.decision, r.reason) for r in (await records(alice))[before:]
    ]
    assert added == [(BOB, "big.output", "allow", "OK")]
    event = json.loads(first.split(b"data:", 1)[1].split(b"\r\n", 1)[0])
    task_id = event.get("result", event)["task"]["id"]
    async with https_client(pki, "bob") as client:
        got = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("GetTask", {"id": task_id}),
            headers=V1_HEADERS,
        )
        assert got.json()["result"]["status"]["state"] == "TASK_STATE_COMPLETED"
        echoed = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendMessage", message_params("text.echo", {"text": "hi"})),
            headers=V1_HEADERS,
        )
        assert echoed.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    # Nothing crashed: no traceback or unfinished response in the server's log.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_stalled_subscription_holds_its_place_until_its_stream_ends(
    pki: Pki, alice: Agent, binding: str, server_log: pytest.LogCaptureFixture
) -> None:
    caplog = server_log
    Gate.release = asyncio.Event()
    params = message_params("big.later", {})
    params["configuration"] = {"returnImmediately": True}
    async with https_client(pki, "bob") as client:
        sent = await client.post(
            alice.https_url + JSONRPC_PATH, json=jsonrpc("SendMessage", params), headers=V1_HEADERS
        )
    task_id = sent.json()["result"]["task"]["id"]
    await until(lambda: alice.limit_stats().in_flight_total == 1, "the task's place")
    sock = await asyncio.to_thread(open_stream, pki, alice, binding, task_id)
    try:
        await asyncio.to_thread(read_first_event, sock)
        await until(lambda: alice.limit_stats().in_flight_total == 2, "the subscription's place")
        Gate.release.set()
        # The task ends and gives its place back; the stalled subscription keeps its own.
        await until(
            lambda: (
                alice.limit_stats().in_flight_total == 1
                and not any(r.name == EDGE_LOGGER for r in caplog.records)
            ),
            "the task's end, with its subscription stalled",
        )
        await until(
            lambda: any(r.name == EDGE_LOGGER for r in caplog.records), "the stalled stream's end"
        )
        await until(lambda: alice.limit_stats().in_flight_total == 0, "the subscription's place")
        rest = await asyncio.to_thread(read_to_the_end, sock)
    finally:
        sock.close()
    assert b"TASK_STATE_COMPLETED" not in rest
    [ended] = [r.getMessage() for r in caplog.records if r.name == EDGE_LOGGER]
    operation = "JSON-RPC" if binding == "jsonrpc" else "SubscribeToTask"
    assert ended == f"ended the A2A {operation} stream of {BOB}: its client read nothing for 1 s"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    await still_serving(pki, alice)
