"""The console's live feed, read as a browser reads it: open, events with their ids, refusals."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki


async def open_feed(
    agent: Agent, last_event_id: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    console = agent.console
    assert console is not None
    host, port = console.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    resume = "" if last_event_id is None else f"Last-Event-ID: {last_event_id}\r\n"
    writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n{resume}\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b": connected\n\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    return reader, writer


async def read_events(reader: asyncio.StreamReader, count: int) -> list[tuple[int, str]]:
    """The next ``count`` decision events as (id, capability), within 10 s."""
    return await asyncio.wait_for(_next_events(reader, count), 10)


async def _next_events(reader: asyncio.StreamReader, count: int) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    while len(found) < count:  # keepalives skipped
        block = (await reader.readuntil(b"\n\n")).decode()
        fields = dict(line.split(": ", 1) for line in block.strip().split("\n") if ": " in line)
        if fields.get("event") == "decision":
            data = json.loads(fields["data"])
            assert int(fields["id"]) == data["seq"]
            found.append((data["seq"], data["capability"]))
    return found


async def make_refusals(agent: Agent, pki: Pki, names: list[str]) -> None:
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
        for name in names:
            with pytest.raises(GatewayError):
                await bob.invoke(name, {"key": "k"})
    await agent.audit.flush()
