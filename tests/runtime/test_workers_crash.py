"""Probe: a worker SIGKILLed during a write leaves one verifiable chain and its key in doubt.

``workers = 2`` served by ``a2a-gateway serve``, with signed audit checkpoints
every few records (worker 0 signs them, covering its sibling's records too),
so ``audit verify --config`` checks the chain *and* the checkpoints written
while both workers appended to it. The worker killed is the one running a
lingering ``notes.append`` (tests.helpers.crash_window): its side effect has
landed, its answer has not.
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
from gateway.errors import GatewayError, IdempotencyInDoubt
from tests.helpers.agent_process import (
    REPO,
    AgentProcess,
    one_client_per_worker,
    two_worker_agent,
    worker_pids,
)
from tests.helpers.agents import Pki, audit_rows, grant
from tests.helpers.crash_window import appended_lines

pytestmark = pytest.mark.slow

POLL_ROUNDS = 400  # x 0.05 s: a bound for a slow runner, never asserted


def _agent(pki: Pki, tmp_path: Path) -> AgentProcess:
    agent = two_worker_agent(
        pki, tmp_path, [grant("bob", ["worker.pid", "notes.append", "text.echo"])]
    )
    agent.config.write_text(agent.config.read_text() + "\n[audit_checkpoints]\nevery_records = 3\n")
    return agent


def _claims(state_dir: Path) -> dict[str, str]:
    db = sqlite3.connect(state_dir / "idempotency.sqlite", timeout=10.0)
    try:
        rows = db.execute("SELECT key, state FROM idempotency").fetchall()
    finally:
        db.close()
    return {str(key): str(state) for key, state in rows}


def _verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "audit", "verify", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("victim_index", [0, 1], ids=["checkpoint-signer", "sibling"])
async def test_a_worker_killed_mid_write_leaves_a_verifiable_chain_and_the_key_in_doubt(
    pki: Pki, tmp_path: Path, victim_index: int
) -> None:
    agent = _agent(pki, tmp_path)
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            workers = worker_pids(agent)
            assert sorted(by_pid) == sorted(workers)
            victim, survivor = workers[victim_index], workers[1 - victim_index]
            for n in range(8):  # records from both workers, interleaved, several checkpoints
                for pid in workers:
                    await by_pid[pid].invoke("text.echo", {"text": f"{n}"})
            write = asyncio.create_task(
                by_pid[victim].invoke(
                    "notes.append", {"note": "cut"}, idempotency_key="k-cut", timeout=30.0
                )
            )
            for _ in range(POLL_ROUNDS):
                if appended_lines(tmp_path / "state") or write.done():
                    break
                await asyncio.sleep(0.05)
            assert appended_lines(tmp_path / "state") == ["cut"] and not write.done()
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(GatewayError):
                await write
            for _ in range(POLL_ROUNDS):  # the restarted worker marks the dead one's claim
                if _claims(tmp_path / "state").get("k-cut") == "in_doubt":
                    break
                await asyncio.sleep(0.05)
            assert _claims(tmp_path / "state") == {"k-cut": "in_doubt"}
            with pytest.raises(IdempotencyInDoubt):  # on the survivor: never a second write
                await by_pid[survivor].invoke(
                    "notes.append", {"note": "cut"}, idempotency_key="k-cut", timeout=30.0
                )
            for n in range(4):  # the survivor keeps appending to the one chain
                await by_pid[survivor].invoke("text.echo", {"text": f"after {n}"})
            # Mid-run: the chain and the checkpoints signed so far verify.
            running = _verify("--db", str(tmp_path / "audit.sqlite"), "--config", str(agent.config))
            assert running.returncode == 0, running.stdout + running.stderr
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()

    assert appended_lines(tmp_path / "state") == ["cut"]
    rows = audit_rows(tmp_path / "audit.sqlite")
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
    cut = [(r.decision, r.reason) for r in rows if r.capability == "notes.append"]
    # The cut-off write: its ADMITTED record only; the retry: admitted, then in doubt.
    assert cut == [
        ("allow", "ADMITTED"),
        ("allow", "ADMITTED"),
        ("allow", "IDEMPOTENCY_IN_DOUBT"),
    ]
    plain = _verify("--db", str(tmp_path / "audit.sqlite"))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    signed = _verify("--db", str(tmp_path / "audit.sqlite"), "--config", str(agent.config))
    assert signed.returncode == 0, signed.stdout + signed.stderr
    checkpoints = (tmp_path / "audit.sqlite.checkpoints.jsonl").read_text().splitlines()
    assert len(checkpoints) >= 2
