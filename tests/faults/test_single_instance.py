"""One serving instance per agent: a second ``serve`` is refused, the first keeps serving.

gRPC sets ``SO_REUSEPORT`` by default, so a second instance used to bind the
first one's port silently and take half its connections. Now the state
directory's lock (``gateway.runtime.instance_lock``) refuses a second instance of the
same config, and a single process binds without ``SO_REUSEPORT``, so a port
someone else listens on is refused too; only an agent's own workers share it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gateway.cli.main import EXIT_USAGE
from gateway.client.peer_client import PeerClient
from gateway.runtime.instance_lock import LOCK_FILE
from tests.helpers.agent_process import AgentProcess, two_worker_agent, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, grant, spiffe, write_policy

EXIT_TIMEOUT = 60.0  # python start-up on a busy runner; a bound, never asserted


def _alice(pki: Pki, tmp_path: Path, *, listen: str = "127.0.0.1:0", state: str = "state") -> Path:
    return write_agent_toml(
        tmp_path / f"alice-{state}.toml",
        pki,
        "alice",
        listen=listen,
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])]),
        audit_db=tmp_path / f"{state}-audit.sqlite",
        state_dir=tmp_path / state,
    )


async def _echo(pki: Pki, address: str) -> str:
    client = PeerClient(spiffe("alice"), address, pki.material("bob"))
    try:
        result = await client.invoke("text.echo", {"text": "still here"})
    finally:
        await client.close()
    return str(result.output()["text"])


def _worker_pids(agent: AgentProcess) -> list[int]:
    assert agent.stdout is not None
    return [int(line.split()[-1]) for line in agent.stdout.seen if line.startswith("worker ")]


def _open_files(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a socket closed meanwhile
            found.add(os.readlink(fd))
    return found


def _refused(config: Path) -> tuple[int, str]:
    second = AgentProcess(config)
    try:
        second.spawn()
        code = second.wait_exit(EXIT_TIMEOUT)
        return code, second.errors(wait=5.0)
    finally:
        second.ensure_stopped()


async def test_a_second_serve_of_the_same_config_is_refused_naming_the_first(
    pki: Pki, tmp_path: Path
) -> None:
    config = _alice(pki, tmp_path)
    first = AgentProcess(config)
    try:
        address = first.start()
        assert first.proc is not None
        code, errors = _refused(config)
        assert code == EXIT_USAGE
        assert errors.strip() == (
            f"error: another a2a-gateway serve (pid {first.proc.pid}) already serves with "
            f"state_dir {tmp_path / 'state'} (lock {tmp_path / 'state' / LOCK_FILE}); "
            "stop it first"
        )
        assert await _echo(pki, address) == "still here"
        assert first.proc.poll() is None
        assert first.terminate() == 0
    finally:
        first.ensure_stopped()
    # The refused instance wrote nothing: one allowed call, one record.
    assert [(r.capability, r.decision) for r in audit_rows(tmp_path / "state-audit.sqlite")] == [
        ("text.echo", "allow")
    ]
    # The lock went with the process: the same config serves again.
    again = AgentProcess(config)
    try:
        assert await _echo(pki, again.start()) == "still here"
    finally:
        again.ensure_stopped()


async def test_a_second_agent_on_a_port_in_use_is_refused(pki: Pki, tmp_path: Path) -> None:
    first = AgentProcess(_alice(pki, tmp_path))
    try:
        address = first.start()
        other = _alice(pki, tmp_path, listen=address, state="other")
        code, errors = _refused(other)
        assert code == EXIT_USAGE
        assert errors.strip().splitlines()[-1] == (  # after gRPC's own log line
            f"error: listen {address}: cannot bind (another process listens there, "
            "or the address is not on this host)"
        )
        assert await _echo(pki, address) == "still here"
    finally:
        first.ensure_stopped()


async def test_a_second_instance_of_a_worker_agent_is_refused(pki: Pki, tmp_path: Path) -> None:
    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["text.echo"])])
    try:
        address = agent.start()
        assert agent.proc is not None
        code, errors = _refused(agent.config)
        assert code == EXIT_USAGE
        assert f"another a2a-gateway serve (pid {agent.proc.pid}) already serves" in errors
        # Each worker holds the lock too: an orphaned worker still serving keeps it.
        lock = str(tmp_path / "state" / LOCK_FILE)
        workers = _worker_pids(agent)
        assert len(workers) == 2
        assert all(lock in _open_files(pid) for pid in workers)
        # Another agent with workers may not join the port through SO_REUSEPORT.
        other = _alice(pki, tmp_path, listen=address, state="other")
        other.write_text("workers = 2\n" + other.read_text())
        code, errors = _refused(other)
        assert code == EXIT_USAGE
        assert errors.strip().startswith(f"error: listen {address}: Address already in use")
        assert "only this agent's own workers may share its port" in errors
        assert not (tmp_path / "other-audit.sqlite").exists()
        assert await _echo(pki, address) == "still here"
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
