"""Nobody holds the HTTPS port's connections: heads have a deadline, connections a budget.

Found by an attack round: a TLS connection that sent nothing, or half a request
head, stayed open for good (uvicorn times out only kept-alive connections, and
the edge's body deadline starts once the head is in), with or without a client
certificate. With the open-file limit at 256, 224 such connections without a
certificate took every descriptor: peers could no longer connect, and asyncio
logged "socket.accept() out of system resource" with its traceback hundreds of
thousands of times.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, protocol, server
from tests.a2a_http_support import (
    V1_HEADERS,
    client_context,
    https_client,
    jsonrpc,
    serving_https,
)
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    standard_registry,
    started,
    write_policy,
)

HEAD_SECONDS = 0.5
BUDGET = (4, 2)
"""Connections at once, of which without a certificate, for this file's agent."""


@pytest.fixture
async def alice(
    pki: Pki, tmp_path: Path, counter: WriteCounter, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Agent]:
    monkeypatch.setattr(protocol, "HEAD_SECONDS", HEAD_SECONDS)
    monkeypatch.setattr(server, "connection_budget", lambda: protocol.ConnectionBudget(*BUDGET))
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


async def connect(
    pki: Pki, agent: Agent, caller: str | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = int(agent.https_url.rsplit(":", 1)[1])
    return await asyncio.open_connection(
        "localhost", port, ssl=client_context(pki, caller), server_hostname="localhost"
    )


async def dropped(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (bounded wait: 20 s)."""
    try:
        return await asyncio.wait_for(reader.read(65536), 20) == b""
    except (ConnectionError, ssl.SSLError):
        return True


async def served(pki: Pki, agent: Agent) -> bool:
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            agent.https_url + JSONRPC_PATH, json=jsonrpc("ListTasks", {}), headers=V1_HEADERS
        )
    return answer.status_code == 200 and "result" in answer.json()


@pytest.mark.parametrize("caller", [None, "bob"])
@pytest.mark.parametrize("sent", [b"", b"POST /a2a/jsonrpc HTTP/1.1\r\nHost: loc"])
async def test_a_connection_whose_head_does_not_arrive_in_time_is_dropped(
    pki: Pki, alice: Agent, caller: str | None, sent: bytes
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    reader, writer = await connect(pki, alice, caller)
    try:
        writer.write(sent)
        await writer.drain()
        assert await dropped(reader)
    finally:
        writer.close()
    assert len(audit_rows(alice.config.audit_db)) == before  # no request: nothing to audit
    assert await served(pki, alice)


async def test_a_kept_alive_connection_times_its_next_head_from_its_first_byte(
    pki: Pki, alice: Agent
) -> None:
    body = json.dumps(jsonrpc("ListTasks", {})).encode()
    request = (
        f"POST {JSONRPC_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"A2A-Version: 1.0\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    reader, writer = await connect(pki, alice, "bob")
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await asyncio.wait_for(reader.readexactly(length), 20)
        writer.write(request[:20])  # the next request starts, and never ends
        await writer.drain()
        assert await dropped(reader)
    finally:
        writer.close()


async def test_a_request_framed_by_both_length_and_chunks_closes_its_connection_after_the_answer(
    pki: Pki, alice: Agent
) -> None:
    # RFC 9112 6.1: a server MUST close the connection after answering such a request (a
    # proxy in front may have framed the body by its length, and what follows is smuggled).
    body = json.dumps(jsonrpc("ListTasks", {})).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    request = (
        f"POST {JSONRPC_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"A2A-Version: 1.0\r\nContent-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode() + chunked
    reader, writer = await connect(pki, alice, "bob")
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200 ")  # answered by the transfer coding
        assert b"\r\nconnection: close\r\n" in head.lower()
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        assert "result" in json.loads(await asyncio.wait_for(reader.readexactly(length), 20))
        assert await dropped(reader)
    finally:
        writer.close()


async def test_connections_over_the_budget_are_dropped_and_anonymous_ones_cannot_crowd_out_peers(
    pki: Pki, alice: Agent
) -> None:
    most, most_anonymous = BUDGET
    held = [await connect(pki, alice, None) for _ in range(most_anonymous)]
    try:
        reader, writer = await connect(pki, alice, None)  # one anonymous too many
        try:
            assert await dropped(reader)
        finally:
            writer.close()
        assert await served(pki, alice)  # a peer still gets a place
        peers = [await connect(pki, alice, "bob") for _ in range(most - most_anonymous)]
        try:
            reader, writer = await connect(pki, alice, "bob")  # every place taken
            try:
                assert await dropped(reader)
            finally:
                writer.close()
        finally:
            for _, peer in peers:
                peer.close()
    finally:
        for _, anonymous in held:
            anonymous.close()
    for _ in range(100):  # bounded: the closed connections give their places back
        if alice_budget(alice).open == 0:
            break
        await asyncio.sleep(0.05)
    assert (alice_budget(alice).open, alice_budget(alice).anonymous) == (0, 0)
    assert await served(pki, alice)


def alice_budget(agent: Agent) -> protocol.ConnectionBudget:
    budget = agent.https_connections
    assert budget is not None
    return budget
