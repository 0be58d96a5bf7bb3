"""``workers = 2`` served by ``a2a-gateway serve``: a grant's burst holds across both workers.

The peer opens several channels (separate connections, which the kernel
spreads over the workers); ``worker.pid`` (tests.helpers.worker_pid) says which
worker served an admitted call. Counts only, never timings: the rate is so
low that no token refills during the test.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from tests.helpers.agent_process import REPO, AgentProcess, two_worker_agent
from tests.helpers.agents import Pki, grant, spiffe
from tests.helpers.crash_window import appended_lines

pytestmark = pytest.mark.slow

BURST = 24
NO_REFILL = 0.0001  # one token per ~3 hours
MAX_CHANNELS = 20  # channels opened to find both workers (each call takes a token)
CALLS_AFTER = 30  # then alternately on the two workers' channels
HOLD_SECONDS = 10.0  # the lingering write's deadline: it holds its place until then
POLL_ROUNDS = 400  # x 0.05 s: a bound for a slow runner, never asserted


def _agent(pki: Pki, tmp_path: Path, **limits: Any) -> AgentProcess:
    return two_worker_agent(
        pki, tmp_path, [{**grant("bob", ["worker.pid", "notes.append"]), **limits}]
    )


def _worker_pids(agent: AgentProcess) -> list[int]:
    assert agent.stdout is not None
    return [int(line.split()[-1]) for line in agent.stdout.seen if line.startswith("worker ")]


async def _one_client_per_worker(
    pki: Pki, address: str, opened: list[PeerClient]
) -> tuple[dict[int, PeerClient], list[int]]:
    """Open channels until both workers answered: ({pid: client}, pids of every call)."""
    by_pid: dict[int, PeerClient] = {}
    found: list[int] = []
    for _ in range(MAX_CHANNELS):  # admitted calls, each on a new connection
        client = PeerClient(spiffe("alice"), address, pki.material("bob"))
        opened.append(client)
        outcome = await _pid_or_reason(client)
        assert isinstance(outcome, int), outcome
        found.append(outcome)
        by_pid.setdefault(outcome, client)
        if len(by_pid) == 2:
            break
    return by_pid, found


async def _pid_or_reason(client: PeerClient) -> int | str:
    try:
        result = await client.invoke("worker.pid", {})
    except GatewayError as err:
        return err.reason
    return int(result.output()["pid"])


def _audit_summary(db: Path) -> set[tuple[str, str, str, int]]:
    summary = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "audit", "--db", str(db), "--summary", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [json.loads(line) for line in summary.stdout.splitlines()]
    return {(r["peer_id"], r["decision"], r["reason"], r["calls"]) for r in rows}


async def test_a_burst_is_shared_by_both_workers_and_audited_exactly(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path, max_calls_per_second=NO_REFILL, burst=BURST)
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        try:
            workers = _worker_pids(agent)
            by_pid, found = await _one_client_per_worker(pki, address, opened)
            assert sorted(by_pid) == sorted(workers), "both workers must have served bob"

            per_worker: dict[int, list[int | str]] = {pid: [] for pid in by_pid}
            for n in range(CALLS_AFTER):
                pid = workers[n % 2]
                per_worker[pid].append(await _pid_or_reason(by_pid[pid]))
            after = [outcome for outcomes in per_worker.values() for outcome in outcomes]
            admitted_after = [outcome for outcome in after if isinstance(outcome, int)]
            # Exactly the burst, both workers together:
            assert len(found) + len(admitted_after) == BURST
            assert sorted(set(after) - set(workers)) == ["RATE_LIMITED"]
            for pid, outcomes in per_worker.items():  # each worker served only on its channel ...
                assert {o for o in outcomes if isinstance(o, int)} <= {pid}
                assert "RATE_LIMITED" in outcomes  # ... and both refused: one bucket ran dry
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0  # a graceful stop flushes the aggregated refusal counts
    finally:
        agent.ensure_stopped()

    refused = len(found) + CALLS_AFTER - BURST
    bob = spiffe("bob")
    assert _audit_summary(tmp_path / "audit.sqlite") == {
        (bob, "allow", "OK", BURST),
        (bob, "refuse", "RATE_LIMITED", refused),
    }


async def test_a_call_running_on_one_worker_counts_on_the_other(pki: Pki, tmp_path: Path) -> None:
    agent = _agent(pki, tmp_path, max_in_flight=1)
    opened: list[PeerClient] = []
    holding: list[asyncio.Task[Any]] = []
    try:
        address = agent.start()
        try:
            by_pid, _ = await _one_client_per_worker(pki, address, opened)
            assert sorted(by_pid) == sorted(_worker_pids(agent))
            holder, other = by_pid.values()
            hold = asyncio.create_task(
                holder.invoke(
                    "notes.append", {"note": "hold"}, idempotency_key="k1", timeout=HOLD_SECONDS
                )
            )
            holding.append(hold)
            for _ in range(POLL_ROUNDS):  # the write ran: its call holds bob's one place
                if appended_lines(tmp_path / "state") or hold.done():
                    break
                await asyncio.sleep(0.05)
            assert appended_lines(tmp_path / "state") == ["hold"] and not hold.done()
            assert await _pid_or_reason(other) == "CONCURRENCY_LIMITED"  # on the other worker
            assert (await hold).output()["appended"] == 1
            assert isinstance(await _pid_or_reason(other), int)  # the place is free for both
        finally:
            for task in holding:
                task.cancel()
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    bob = spiffe("bob")
    assert (bob, "refuse", "CONCURRENCY_LIMITED", 1) in _audit_summary(tmp_path / "audit.sqlite")


async def test_the_supervisor_makes_the_limits_table_for_its_workers(
    pki: Pki, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "limits.table").write_bytes(b"left by something else")
    agent = _agent(pki, tmp_path, max_in_flight=1)
    try:
        address = agent.start()  # made anew: both workers started on it
        async with PeerClient(spiffe("alice"), address, pki.material("bob")) as client:
            assert isinstance(await _pid_or_reason(client), int)
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    assert (state / "limits.table").read_bytes()[:8] == b"A2AGW-LT"
