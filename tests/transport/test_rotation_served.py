"""A served agent (real process) picks up `pki issue --force` and refuses a broken file on SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.agent_process import REPO, AgentProcess, write_agent_toml
from tests.helpers.agents import grant, spiffe, write_policy
from tests.helpers.rotation import file_serial, own_pki, served_serial

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def wait_for_serial(pki: object, address: str, expected: int) -> int:
    serial = 0
    deadline = time.monotonic() + 30  # bounded: the watcher polls every second
    while time.monotonic() < deadline:
        serial = served_serial(pki, address, spiffe("alice"))  # type: ignore[arg-type]
        if serial == expected:
            return serial
        time.sleep(0.2)
    return serial


def test_pki_issue_force_rotates_a_running_agent_and_sighup_rejects_a_broken_file(
    tmp_path: Path,
) -> None:
    pki = own_pki(tmp_path)
    refused = cli("pki", "issue", "alice", "--dir", str(pki.dir))
    assert refused.returncode == 2 and "--force" in refused.stderr
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
    )
    agent = AgentProcess(config)
    try:
        address = agent.start()
        old = file_serial(pki.dir / "alice.pem")
        assert served_serial(pki, address, spiffe("alice")) == old
        rotated = cli("pki", "issue", "alice", "--dir", str(pki.dir), "--force")
        assert rotated.returncode == 0, rotated.stderr
        new = file_serial(pki.dir / "alice.pem")
        assert new != old
        assert wait_for_serial(pki, address, new) == new  # picked up by the file watcher
        (pki.dir / "alice.pem").write_text("-----BEGIN CERTIFICATE-----\nbroken\n")
        assert agent.proc is not None
        os.kill(agent.proc.pid, signal.SIGHUP)
        assert served_serial(pki, address, spiffe("alice")) == new
        assert agent.terminate() == 0
        errors = agent.errors(wait=10)
        assert "certificate reload rejected" in errors
        assert "PRIVATE KEY" not in errors and "broken" not in errors
    finally:
        agent.ensure_stopped()
