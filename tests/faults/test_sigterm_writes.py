"""SIGTERM while admitted writes are still running past the stop's grace.

``serve`` (one worker, and ``workers = 2``) stops gracefully: calls in flight get
the grace period, then gRPC cancels them. A cancelled write whose side effect
happened must end with its ``CANCELLED`` record, as the handler promises, not
look like a crash (an ``ADMITTED`` record and nothing after it). The records of
those calls used to be dropped: the server's stop returned before the cancelled
handlers unwound, and the audit log closed under them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from tests.helpers.agent_process import REPO, WORKER_TEST_MODULES, AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, grant, spiffe, write_policy
from tests.helpers.crash_window import appended_lines

MAX_CHANNELS = 32  # channels opened to reach every worker (a bound, never asserted)
POLL_ROUNDS = 400  # x 0.05 s (a bound, never asserted)


def _agent(pki: Pki, tmp_path: Path, workers: int) -> AgentProcess:
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(
            tmp_path / "policy.toml", [grant("bob", ["worker.pid", "notes.append"])]
        ),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
        modules=WORKER_TEST_MODULES,
    )
    config.write_text(f"workers = {workers}\n" + config.read_text())
    return AgentProcess(config)


@pytest.mark.parametrize("workers", [1, 2])
async def test_writes_cancelled_by_sigterm_keep_their_cancelled_record(
    pki: Pki, tmp_path: Path, workers: int
) -> None:
    agent = _agent(pki, tmp_path, workers)
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        by_pid: dict[int, PeerClient] = {}
        for _ in range(MAX_CHANNELS):
            client = PeerClient(spiffe("alice"), address, pki.material("bob"))
            opened.append(client)
            pid = int((await client.invoke("worker.pid", {})).output()["pid"])
            by_pid.setdefault(pid, client)
            if len(by_pid) == workers:
                break
        assert len(by_pid) == workers
        notes = [f"n{i}" for i in range(workers)]
        # First run of a note lingers until its deadline: far past the 2 s grace.
        calls = [
            asyncio.create_task(client.invoke("notes.append", {"note": note}, timeout=20.0))
            for note, client in zip(notes, by_pid.values(), strict=True)
        ]
        for _ in range(POLL_ROUNDS):
            if len(appended_lines(tmp_path / "state")) == workers:
                break
            await asyncio.sleep(0.05)
        assert sorted(appended_lines(tmp_path / "state")) == notes  # every side effect ran
        assert agent.proc is not None
        os.kill(agent.proc.pid, signal.SIGTERM)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert [type(o) for o in outcomes] == [type(outcomes[0])] * workers
        assert all(isinstance(o, GatewayError) for o in outcomes), outcomes
        assert agent.wait_exit(60) == 0
    finally:
        for client in opened:
            await client.close()
        agent.ensure_stopped()

    assert sorted(appended_lines(tmp_path / "state")) == notes  # and ran once each
    rows = audit_rows(tmp_path / "audit.sqlite")
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
    writes = sorted((r.reason, r.decision) for r in rows if r.capability == "notes.append")
    assert writes == [("ADMITTED", "allow")] * workers + [("CANCELLED", "allow")] * workers
    command = [sys.executable, "-m", "gateway.cli.main", "audit", "verify"]
    verify = await asyncio.to_thread(
        subprocess.run,
        [*command, "--db", str(tmp_path / "audit.sqlite")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
