"""Probe: ``Last-Event-ID`` values the console's live feed did not see a test for.

Already covered (tests/console/test_console_live_resume.py): a gap replayed once
and in order, ``0`` replaying from the start in bounded parts, and ``abc``,
``-1``, ``1e3``, 40 digits and an empty value starting from now.

Holds (no defect found): a Last-Event-ID beyond the log's end (a page of an
earlier, longer log, or an invented number) and one sent while the log is still
empty open the stream, replay nothing, and then show every new decision once;
a non-ASCII digit string (``٣``, which ``str.isdigit`` accepts) and ``+1`` start
from now, replaying nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.console import live
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki
from tests.helpers.console_feed import make_refusals, open_feed, read_events

pytestmark = pytest.mark.slow


async def _nothing_replayed_then_live(
    agent: Agent, pki: Pki, last_event_id: str, new_seq: int
) -> None:
    reader, writer = await open_feed(agent, last_event_id)
    try:
        await make_refusals(agent, pki, ["kv.put"])
        assert await read_events(reader, 1) == [(new_seq, "kv.put")]  # the first event: no replay
    finally:
        writer.close()


@pytest.mark.parametrize("value", ["999999", "9" * 18])
async def test_a_last_event_id_beyond_the_end_replays_nothing_and_stays_live(
    console_agent: Agent, pki: Pki, value: str
) -> None:
    await make_refusals(console_agent, pki, ["kv.get"])  # seq 1
    await asyncio.sleep(4 * live.POLL_SECONDS)
    await _nothing_replayed_then_live(console_agent, pki, value, 2)


async def test_a_last_event_id_while_the_log_is_empty_is_harmless(
    console_agent: Agent, pki: Pki
) -> None:
    await _nothing_replayed_then_live(console_agent, pki, "5", 1)


@pytest.mark.parametrize("value", ["\u0663", "+1", "0x1"])
async def test_digits_of_another_script_or_a_sign_start_from_now(
    console_agent: Agent, pki: Pki, value: str
) -> None:
    await make_refusals(console_agent, pki, ["kv.get"])  # seq 1, before the page
    await asyncio.sleep(4 * live.POLL_SECONDS)
    await _nothing_replayed_then_live(console_agent, pki, value, 2)
