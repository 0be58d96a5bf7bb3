"""Probe: a live page that reconnects loses no decision and repeats none.

Every event of ``/events`` carries ``id: <seq>``, so a browser's EventSource
reconnects (after a drop for stalling, a network blip, a console restart)
with ``Last-Event-ID: <seq>``. The console ignored it and streamed only what
committed after the reconnect: every decision of the gap was silently missing
from a page that said "live" again.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading

import pytest

from gateway.console import live
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki
from tests.helpers.console_feed import make_refusals, open_feed, read_events

pytestmark = pytest.mark.slow


async def test_a_reconnecting_page_gets_the_gap_once_and_in_order(
    console_agent: Agent, pki: Pki
) -> None:
    reader, writer = await open_feed(console_agent)
    await make_refusals(console_agent, pki, ["kv.get"])
    [(first, _)] = await read_events(reader, 1)
    writer.close()  # the page drops; three decisions commit meanwhile
    await make_refusals(console_agent, pki, ["kv.put", "kv.get", "kv.put"])
    await asyncio.sleep(4 * live.POLL_SECONDS)  # the feed has passed them (EventSource waits 2 s)

    reader, writer = await open_feed(console_agent, str(first))
    try:
        gap = await read_events(reader, 3)
        assert gap == [(first + 1, "kv.put"), (first + 2, "kv.get"), (first + 3, "kv.put")]
        await make_refusals(console_agent, pki, ["kv.get"])
        assert await read_events(reader, 1) == [(first + 4, "kv.get")]  # no repeat of the gap
    finally:
        writer.close()


async def test_a_long_gap_is_sent_in_bounded_parts(
    console_agent: Agent, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "QUEUE_RECORDS", 3)
    await make_refusals(console_agent, pki, ["kv.get"] * 5)
    reader, writer = await open_feed(console_agent, "0")
    try:
        assert [seq for seq, _ in await read_events(reader, 3)] == [1, 2, 3]
        rest = await asyncio.wait_for(reader.read(), 10)  # then the server ends the stream
        assert b"event: decision" not in rest
    finally:
        writer.close()
    reader, writer = await open_feed(console_agent, "3")  # as the browser reconnects
    try:
        assert [seq for seq, _ in await read_events(reader, 2)] == [4, 5]
    finally:
        writer.close()


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", "9" * 40, ""])
async def test_an_unusable_last_event_id_starts_from_now(
    console_agent: Agent, pki: Pki, value: str
) -> None:
    await make_refusals(console_agent, pki, ["kv.get"])  # seq 1, before the page
    await asyncio.sleep(4 * live.POLL_SECONDS)
    reader, writer = await open_feed(console_agent, value)
    try:
        await make_refusals(console_agent, pki, ["kv.put"])
        assert await read_events(reader, 1) == [(2, "kv.put")]
    finally:
        writer.close()


async def test_a_row_that_cannot_be_read_is_warned_of_once_and_the_rows_before_it_shown(
    console_agent: Agent, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await open_feed(console_agent)
    try:
        await make_refusals(console_agent, pki, ["kv.get"])
        [(first, _)] = await read_events(reader, 1)
        # Two more decisions, and the second of them altered in the log before the feed reads
        # it: the feed's one thread is held meanwhile, so no poll comes between.
        console = console_agent.console
        assert console is not None
        held = threading.Event()
        console._live._thread.submit(held.wait, 10)
        with caplog.at_level(logging.WARNING, logger="gateway.console.live"):
            await make_refusals(console_agent, pki, ["kv.put", "kv.get"])
            with sqlite3.connect(console_agent.config.audit_db) as conn:
                conn.execute(
                    "UPDATE audit_records SET time_unix_ms = 9e18 WHERE seq = ?", (first + 2,)
                )
            held.set()
            assert await read_events(reader, 1) == [(first + 1, "kv.put")]  # not lost with it
            await asyncio.sleep(10 * live.POLL_SECONDS)  # ten polls, each stopped at the row
        warned = [r for r in caplog.records if "audit log not readable" in r.getMessage()]
        assert len(warned) == 1
    finally:
        writer.close()
