"""Probe: a live page that reconnects loses no decision and repeats none.

Every event of ``/events`` carries ``id: <seq>``, so a browser's EventSource
reconnects (after a drop for stalling, a network blip, a console restart)
with ``Last-Event-ID: <seq>``. The console ignored it and streamed only what
committed after the reconnect: every decision of the gap was silently missing
from a page that said "live" again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading

import pytest

from gateway.client.peer_client import PeerClient
from gateway.console import live
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki


async def _open(
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


async def _events(reader: asyncio.StreamReader, count: int) -> list[tuple[int, str]]:
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


async def _refusals(agent: Agent, pki: Pki, names: list[str]) -> None:
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
        for name in names:
            with pytest.raises(GatewayError):
                await bob.invoke(name, {"key": "k"})
    await agent.audit.flush()


async def test_a_reconnecting_page_gets_the_gap_once_and_in_order(
    console_agent: Agent, pki: Pki
) -> None:
    reader, writer = await _open(console_agent)
    await _refusals(console_agent, pki, ["kv.get"])
    [(first, _)] = await _events(reader, 1)
    writer.close()  # the page drops; three decisions commit meanwhile
    await _refusals(console_agent, pki, ["kv.put", "kv.get", "kv.put"])
    await asyncio.sleep(4 * live.POLL_SECONDS)  # the feed has passed them (EventSource waits 2 s)

    reader, writer = await _open(console_agent, str(first))
    try:
        gap = await _events(reader, 3)
        assert gap == [(first + 1, "kv.put"), (first + 2, "kv.get"), (first + 3, "kv.put")]
        await _refusals(console_agent, pki, ["kv.get"])
        assert await _events(reader, 1) == [(first + 4, "kv.get")]  # no repeat of the gap
    finally:
        writer.close()


async def test_a_long_gap_is_sent_in_bounded_parts(
    console_agent: Agent, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "QUEUE_RECORDS", 3)
    await _refusals(console_agent, pki, ["kv.get"] * 5)
    reader, writer = await _open(console_agent, "0")
    try:
        assert [seq for seq, _ in await _events(reader, 3)] == [1, 2, 3]
        rest = await asyncio.wait_for(reader.read(), 10)  # then the server ends the stream
        assert b"event: decision" not in rest
    finally:
        writer.close()
    reader, writer = await _open(console_agent, "3")  # as the browser reconnects
    try:
        assert [seq for seq, _ in await _events(reader, 2)] == [4, 5]
    finally:
        writer.close()


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", "9" * 40, ""])
async def test_an_unusable_last_event_id_starts_from_now(
    console_agent: Agent, pki: Pki, value: str
) -> None:
    await _refusals(console_agent, pki, ["kv.get"])  # seq 1, before the page
    await asyncio.sleep(4 * live.POLL_SECONDS)
    reader, writer = await _open(console_agent, value)
    try:
        await _refusals(console_agent, pki, ["kv.put"])
        assert await _events(reader, 1) == [(2, "kv.put")]
    finally:
        writer.close()


async def test_a_row_that_cannot_be_read_is_warned_of_once_and_the_rows_before_it_shown(
    console_agent: Agent, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await _open(console_agent)
    try:
        await _refusals(console_agent, pki, ["kv.get"])
        [(first, _)] = await _events(reader, 1)
        # Two more decisions, and the second of them altered in the log before the feed reads
        # it: the feed's one thread is held meanwhile, so no poll comes between.
        console = console_agent.console
        assert console is not None
        held = threading.Event()
        console._live._thread.submit(held.wait, 10)
        with caplog.at_level(logging.WARNING, logger="gateway.console.live"):
            await _refusals(console_agent, pki, ["kv.put", "kv.get"])
            with sqlite3.connect(console_agent.config.audit_db) as conn:
                conn.execute(
                    "UPDATE audit_records SET time_unix_ms = 9e18 WHERE seq = ?", (first + 2,)
                )
            held.set()
            assert await _events(reader, 1) == [(first + 1, "kv.put")]  # not lost with it
            await asyncio.sleep(10 * live.POLL_SECONDS)  # ten polls, each stopped at the row
        warned = [r for r in caplog.records if "audit log not readable" in r.getMessage()]
        assert len(warned) == 1
    finally:
        writer.close()
