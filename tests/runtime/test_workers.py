"""``workers = 2``: two serving processes on one port, one policy, chain, window and key store.

The agent runs as ``serve`` (a supervisor and two worker processes). Separate
channels are separate connections, which the kernel spreads over the workers;
``worker.pid`` (tests.helpers.worker_pid) says which worker served a call.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError, IdempotencyInDoubt, ReplayedRequest
from tests.helpers.agent_process import REPO, AgentProcess, two_worker_agent
from tests.helpers.agents import Pki, audit_rows, grant, spiffe
from tests.helpers.crash_window import appended_lines

pytestmark = pytest.mark.slow

MAX_CHANNELS = 32  # connections opened to find both workers (a bound, never asserted)
POLL_ROUNDS = 400  # x 0.05 s: a bound for a slow runner, never asserted


def _agent(pki: Pki, tmp_path: Path, *, pin: bool = False) -> AgentProcess:
    grants = [grant("bob", ["worker.pid", "notes.append", "text.echo"])]
    return two_worker_agent(pki, tmp_path, grants, pin=pin)


def _worker_pids(agent: AgentProcess) -> list[int]:
    assert agent.stdout is not None
    return [int(line.split()[-1]) for line in agent.stdout.seen if line.startswith("worker ")]


async def _one_client_per_worker(
    pki: Pki, address: str
) -> tuple[dict[int, PeerClient], list[PeerClient]]:
    """Open channels until two workers answered; returns {pid: client} and every client."""
    by_pid: dict[int, PeerClient] = {}
    opened: list[PeerClient] = []
    for _ in range(MAX_CHANNELS):
        client = PeerClient(spiffe("alice"), address, pki.material("bob"))
        opened.append(client)
        result = await client.invoke("worker.pid", {})
        by_pid.setdefault(int(result.output()["pid"]), client)
        if len(by_pid) == 2:
            break
    return by_pid, opened


def _claims(state_dir: Path) -> dict[str, tuple[str, str]]:
    db = sqlite3.connect(state_dir / "idempotency.sqlite", timeout=10.0)
    try:
        rows = db.execute("SELECT key, state, claim_owner FROM idempotency").fetchall()
    finally:
        db.close()
    return {str(key): (str(state), str(owner)) for key, state, owner in rows}


def _audit_verify(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "audit", "verify", "--db", str(db)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _owner_pid(owner: str) -> int:
    return int(owner.split(":")[1])


async def test_two_workers_share_replay_window_keys_and_one_chain(pki: Pki, tmp_path: Path) -> None:
    agent = _agent(pki, tmp_path)
    try:
        address = agent.start()
        workers = _worker_pids(agent)
        assert len(workers) == 2
        by_pid, opened = await _one_client_per_worker(pki, address)
        try:
            assert sorted(by_pid) == sorted(workers), "calls did not land on both workers"
            first, second = (by_pid[pid] for pid in workers)

            # A request id used on one worker is refused on the other.
            await first.invoke("text.echo", {"text": "once"}, request_id="rid-1")
            with pytest.raises(ReplayedRequest):
                await second.invoke("text.echo", {"text": "once"}, request_id="rid-1")

            # One key, two workers at once: the write runs once.
            outcomes = await asyncio.gather(
                *(
                    client.invoke("notes.append", {"note": "x"}, idempotency_key="k-x", timeout=3.0)
                    for client in (first, second)
                ),
                return_exceptions=True,
            )
            assert appended_lines(tmp_path / "state") == ["x"], "one key wrote twice"
            answered = [o for o in outcomes if not isinstance(o, BaseException)]
            refused = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(answered) + len(refused) == 2
            assert all(isinstance(err, IdempotencyInDoubt) for err in refused)
            assert len(answered) >= 1
            again = await second.invoke("notes.append", {"note": "x"}, idempotency_key="k-x")
            assert again.remembered
            assert appended_lines(tmp_path / "state") == ["x"]
        finally:
            for client in opened:
                await client.close()

        assert agent.terminate() == 0
        for pid in workers:  # SIGTERM reached both workers: both are gone
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        agent.ensure_stopped()

    rows = audit_rows(tmp_path / "audit.sqlite")
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
    replayed = [r for r in rows if r.reason == "REPLAYED_REQUEST"]
    assert len(replayed) == 1 and replayed[0].decision == "refuse"  # the refusal is durable
    verify = _audit_verify(tmp_path / "audit.sqlite")
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_sigkilled_worker_claims_in_doubt_sibling_claims_stay(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path)
    try:
        address = agent.start()
        by_pid, opened = await _one_client_per_worker(pki, address)
        calls: list[asyncio.Task[object]] = []
        try:
            assert len(by_pid) == 2
            for n, client in enumerate(by_pid.values()):  # a lingering write on each worker
                calls.append(
                    asyncio.create_task(
                        client.invoke(
                            "notes.append", {"note": f"n{n}"}, idempotency_key=f"k{n}", timeout=30.0
                        )
                    )
                )
            for _ in range(POLL_ROUNDS):
                claims = _claims(tmp_path / "state")
                if len(claims) == 2 or any(call.done() for call in calls):
                    break
                await asyncio.sleep(0.05)
            claims = _claims(tmp_path / "state")
            assert {state for state, _ in claims.values()} == {"claimed"}
            victim = _owner_pid(claims["k0"][1])
            survivor = _owner_pid(claims["k1"][1])
            assert {victim, survivor} == set(by_pid)
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(GatewayError):
                await calls[0]
            for _ in range(POLL_ROUNDS):  # the restarted worker marks the dead one's claims
                if _claims(tmp_path / "state")["k0"][0] != "claimed":
                    break
                await asyncio.sleep(0.05)
            claims = _claims(tmp_path / "state")
            assert claims["k0"][0] == "in_doubt"
            assert claims["k1"] == ("claimed", claims["k1"][1])  # the sibling's is untouched
            assert not calls[1].done()
        finally:
            for call in calls:
                call.cancel()
            for client in opened:
                await client.close()
        assert agent.stdout is not None
        while len(_worker_pids(agent)) < 3 and agent.stdout.next_line(60.0) is not None:
            pass  # the supervisor's line for the restarted worker
        assert len(_worker_pids(agent)) == 3  # two started, one restarted
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()


async def test_ids_used_before_a_worker_is_sigkilled_stay_refused_on_every_worker(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path)
    try:
        address = agent.start()
        by_pid, opened = await _one_client_per_worker(pki, address)
        try:
            assert len(by_pid) == 2
            victim, survivor = by_pid
            await by_pid[victim].invoke("text.echo", {"text": "a"}, request_id="on-victim")
            await by_pid[survivor].invoke("text.echo", {"text": "b"}, request_id="on-survivor")
            os.kill(victim, signal.SIGKILL)
        finally:
            for client in opened:
                await client.close()
        assert agent.stdout is not None
        while len(_worker_pids(agent)) < 3 and agent.stdout.next_line(60.0) is not None:
            pass  # the supervisor's line for the restarted worker
        assert len(_worker_pids(agent)) == 3
        by_pid, opened = await _one_client_per_worker(pki, address)
        try:
            assert sorted(by_pid) == sorted(set(_worker_pids(agent)) - {victim})
            for client in by_pid.values():  # the restarted worker and the survivor
                for request_id in ("on-victim", "on-survivor"):
                    with pytest.raises(ReplayedRequest):
                        await client.invoke("text.echo", {"text": "c"}, request_id=request_id)
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()

    rows = audit_rows(tmp_path / "audit.sqlite")
    replayed = [r for r in rows if r.reason == "REPLAYED_REQUEST"]
    assert len(replayed) == 4 and {r.decision for r in replayed} == {"refuse"}
    assert sorted(r.request_id for r in replayed) == ["on-survivor"] * 2 + ["on-victim"] * 2
    verify = _audit_verify(tmp_path / "audit.sqlite")
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
async def test_pinned_workers_run_their_loops_on_a_cpu_each(pki: Pki, tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    agent = _agent(pki, tmp_path, pin=True)
    try:
        address = agent.start()
        workers = _worker_pids(agent)
        assert [os.sched_getaffinity(pid) for pid in workers] == [
            {cpus[0]},
            {cpus[1 % len(cpus)]},
        ]
        by_pid, opened = await _one_client_per_worker(pki, address)
        try:  # pinned workers still serve
            assert sorted(by_pid) == sorted(workers)
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()


def test_a_config_the_workers_refuse_exits_as_one_process_would(pki: Pki, tmp_path: Path) -> None:
    agent = _agent(pki, tmp_path)
    (tmp_path / "policy.toml").unlink()  # every worker refuses to start without its policy
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(agent.config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr  # a usage/config error, as with workers = 1
    assert "error: " in result.stderr and "policy" in result.stderr
    assert "error: worker 0 did not start (exit 2)" in result.stderr
    assert "Traceback" not in result.stderr
