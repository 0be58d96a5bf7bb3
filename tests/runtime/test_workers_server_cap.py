"""Probe: the agent's ``max_concurrent_calls`` holds across both workers, served.

``workers = 2`` served by ``a2a-gateway serve`` with ``max_concurrent_calls = 1``:
a lingering write of bob's on one worker takes the agent's one place, so
carol's call on the other worker is ``SERVER_BUSY`` (not her own limit), and
audited; once the write ends both workers admit again. Counts only.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from tests.helpers.agent_process import one_client_per_worker, two_worker_agent, worker_pids
from tests.helpers.agents import Pki, audit_rows, grant, spiffe
from tests.helpers.crash_window import appended_lines

pytestmark = pytest.mark.slow

POLL_ROUNDS = 400  # x 0.05 s: a bound for a slow runner, never asserted


async def _pid_or_reason(client: PeerClient) -> int | str:
    try:
        result = await client.invoke("worker.pid", {})
    except GatewayError as err:
        return err.reason
    return int(result.output()["pid"])


async def test_the_servers_cap_counts_the_calls_of_both_workers(pki: Pki, tmp_path: Path) -> None:
    agent = two_worker_agent(
        pki,
        tmp_path,
        [grant("bob", ["worker.pid", "notes.append"]), grant("carol", ["worker.pid"])],
    )
    agent.config.write_text("max_concurrent_calls = 1\n" + agent.config.read_text())
    opened: list[PeerClient] = []
    holding: list[asyncio.Task[Any]] = []
    try:
        address = agent.start()
        try:
            bobs = await one_client_per_worker(pki, address, opened, "bob")
            carols = await one_client_per_worker(pki, address, opened, "carol")
            workers = worker_pids(agent)
            assert sorted(bobs) == sorted(carols) == sorted(workers)
            hold = asyncio.create_task(
                bobs[workers[0]].invoke("notes.append", {"note": "hold"}, timeout=6.0)
            )
            holding.append(hold)
            for _ in range(POLL_ROUNDS):
                if appended_lines(tmp_path / "state") or hold.done():
                    break
                await asyncio.sleep(0.05)
            assert appended_lines(tmp_path / "state") == ["hold"] and not hold.done()
            assert await _pid_or_reason(carols[workers[1]]) == "SERVER_BUSY"
            assert await _pid_or_reason(carols[workers[0]]) == "SERVER_BUSY"
            assert (await hold).output()["appended"] == 1
            assert await _pid_or_reason(carols[workers[1]]) == workers[1]
            assert await _pid_or_reason(bobs[workers[1]]) == workers[1]
        finally:
            for task in holding:
                task.cancel()
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    refused = [r for r in audit_rows(tmp_path / "audit.sqlite") if r.decision == "refuse"]
    assert {(r.peer_id, r.reason) for r in refused} == {(spiffe("carol"), "SERVER_BUSY")}
    assert sum(int(r.detail.split("count=")[1].split()[0]) for r in refused) == 2
