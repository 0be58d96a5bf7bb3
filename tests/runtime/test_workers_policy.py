"""Probe: policy changes hold on EVERY worker of a ``workers = 2`` agent.

The agent runs as ``serve`` (a supervisor and two worker processes). Separate
channels are separate connections, which the kernel spreads over the workers;
``worker.pid`` says which worker a channel reaches, and a channel stays on its
worker. The policy file is rewritten (temp file + rename) and SIGHUP is sent to
the supervisor, which forwards it to both workers (each also watches the file).
Bounded polls only, never timing assertions.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from tests.helpers.agent_process import one_client_per_worker, two_worker_agent, worker_pids
from tests.helpers.agents import Pki, audit_rows, grant, spiffe, write_policy

pytestmark = pytest.mark.slow

POLL_ROUNDS = 200  # x 0.05 s: a bound for a slow runner, never asserted


async def _outcome(client: PeerClient, capability: str = "worker.pid") -> int | str:
    payload = {"text": "hi"} if capability == "text.echo" else {}
    try:
        result = await client.invoke(capability, payload)
    except GatewayError as err:
        return err.reason
    output = result.output()
    return int(output["pid"]) if "pid" in output else "OK"


def _replace_policy(path: Path, grants: list[dict[str, object]]) -> None:
    fresh = write_policy(path.with_name("policy.next.toml"), grants)
    os.replace(fresh, path)


async def _until_each(
    clients: dict[int, PeerClient], capability: str, expected: str
) -> dict[int, int | str]:
    """Poll every worker's channel until it answers ``expected`` (bounded); the last answers."""
    last: dict[int, int | str] = {}
    for pid, client in clients.items():
        for _ in range(POLL_ROUNDS):
            last[pid] = await _outcome(client, capability)
            if last[pid] == expected:
                break
            await asyncio.sleep(0.05)
    return last


async def test_a_revoked_grant_is_refused_on_both_workers_after_sighup(
    pki: Pki, tmp_path: Path
) -> None:
    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["worker.pid", "text.echo"])])
    policy = tmp_path / "policy.toml"
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            assert sorted(by_pid) == sorted(worker_pids(agent))
            for client in by_pid.values():
                assert await _outcome(client, "text.echo") == "OK"

            # Narrowed: text.echo is no longer granted.
            _replace_policy(policy, [grant("bob", ["worker.pid"])])
            assert agent.proc is not None
            os.kill(agent.proc.pid, signal.SIGHUP)
            answers = await _until_each(by_pid, "text.echo", "CAPABILITY_NOT_GRANTED")
            assert answers == {pid: "CAPABILITY_NOT_GRANTED" for pid in by_pid}
            for pid, client in by_pid.items():  # still the same workers, still granted
                assert await _outcome(client) == pid

            # Revoked: bob has no grant at all.
            _replace_policy(policy, [grant("carol", ["worker.pid"])])
            os.kill(agent.proc.pid, signal.SIGHUP)
            answers = await _until_each(by_pid, "worker.pid", "UNKNOWN_PEER")
            assert answers == {pid: "UNKNOWN_PEER" for pid in by_pid}
            for client in by_pid.values():  # and it stays refused
                assert await _outcome(client, "text.echo") == "UNKNOWN_PEER"
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    refused = [r for r in audit_rows(tmp_path / "audit.sqlite") if r.decision == "refuse"]
    assert {r.reason for r in refused} == {"CAPABILITY_NOT_GRANTED", "UNKNOWN_PEER"}
    assert all(r.peer_id == spiffe("bob") for r in refused)


async def test_a_grant_that_expires_on_open_connections_is_refused_on_both_workers(
    pki: Pki, tmp_path: Path
) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=25)
    agent = two_worker_agent(
        pki, tmp_path, [grant("bob", ["worker.pid"], expires_at=expires.isoformat())]
    )
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            if len(by_pid) < 2 or datetime.now(UTC) >= expires:
                pytest.skip("could not reach both workers before the grant expired")
            await asyncio.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.5)
            for client in by_pid.values():  # the same open connections
                assert await _outcome(client) == "GRANT_EXPIRED"
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    refused = [r for r in audit_rows(tmp_path / "audit.sqlite") if r.decision == "refuse"]
    assert [r.reason for r in refused] == ["GRANT_EXPIRED", "GRANT_EXPIRED"]


async def test_an_invalid_policy_after_sighup_keeps_the_last_good_one_on_both_workers(
    pki: Pki, tmp_path: Path
) -> None:
    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["worker.pid", "text.echo"])])
    policy = tmp_path / "policy.toml"
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            assert sorted(by_pid) == sorted(worker_pids(agent))
            bad = policy.with_name("policy.bad.toml")
            bad.write_text('version = 1\n[[grants]]\npeer = "not a spiffe id"\n')
            os.replace(bad, policy)
            assert agent.proc is not None
            os.kill(agent.proc.pid, signal.SIGHUP)
            assert agent.stderr is not None
            rejected = 0
            for _ in range(POLL_ROUNDS):  # each worker logs its rejection (SIGHUP or watcher)
                rejected = sum("policy reload rejected" in line for line in agent.stderr.seen)
                if rejected >= 2:
                    break
                try:
                    agent.stderr.next_line(0.05)
                except TimeoutError:
                    pass
            assert rejected >= 2, agent.errors()
            for pid, client in by_pid.items():  # the last good policy still decides
                assert await _outcome(client) == pid
                assert await _outcome(client, "text.echo") == "OK"

            # A good narrowed policy afterwards is taken by both workers.
            _replace_policy(policy, [grant("bob", ["worker.pid"])])
            os.kill(agent.proc.pid, signal.SIGHUP)
            answers = await _until_each(by_pid, "text.echo", "CAPABILITY_NOT_GRANTED")
            assert answers == {pid: "CAPABILITY_NOT_GRANTED" for pid in by_pid}
            assert sorted(worker_pids(agent)) == sorted(by_pid)  # no worker died on it
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()


async def test_a_worker_restarted_while_the_policy_file_is_bad_does_not_stop_its_sibling(
    pki: Pki, tmp_path: Path
) -> None:
    """Docs: a bad policy file is refused and the old set stays in force; a worker that
    dies is restarted (at most 5 restarts within 60 s). A worker restarted while the
    file is bad cannot start; that must not stop the sibling still serving under the
    last good policy, and the restart is tried again (within the restart budget)."""
    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["worker.pid", "text.echo"])])
    policy = tmp_path / "policy.toml"
    opened: list[PeerClient] = []
    try:
        address = agent.start()
        assert agent.proc is not None and agent.stdout is not None and agent.stderr is not None
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            workers = worker_pids(agent)
            assert sorted(by_pid) == sorted(workers)
            victim, survivor = workers[1], workers[0]
            bad = policy.with_name("policy.bad.toml")
            bad.write_text("garbage = [\n")
            os.replace(bad, policy)
            os.kill(agent.proc.pid, signal.SIGHUP)
            os.kill(victim, signal.SIGKILL)
            failed = False
            for _ in range(POLL_ROUNDS):  # the restart is tried with the bad file
                failed = any("worker 1 did not start" in line for line in agent.stderr.seen)
                if failed:
                    break
                try:
                    if agent.stderr.next_line(0.5) is None:
                        break
                except TimeoutError:
                    pass
            assert failed, agent.errors()
            # The operator fixes the file (narrowed): the sibling takes it, worker 1 comes back.
            _replace_policy(policy, [grant("bob", ["worker.pid"])])
            os.kill(agent.proc.pid, signal.SIGHUP)
            line: str | None = ""
            while len(worker_pids(agent)) < 3 and line is not None:
                try:
                    line = agent.stdout.next_line(30.0)
                except TimeoutError:
                    break
            assert agent.proc.poll() is None, f"supervisor exited: {agent.errors()}"
            assert len(worker_pids(agent)) == 3  # two started, worker 1 restarted
            answers = await _until_each(
                {survivor: by_pid[survivor]}, "text.echo", "CAPABILITY_NOT_GRANTED"
            )
            assert answers == {survivor: "CAPABILITY_NOT_GRANTED"}
            assert await _outcome(by_pid[survivor]) == survivor  # the sibling never stopped
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
