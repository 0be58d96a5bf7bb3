"""Storage in trouble (locked, disk full, read-only): the agent fails closed and says why.

Root ignores file permission bits, so storage faults are made for real: a
second SQLite connection holding the write lock, a tiny tmpfs filled to the
last page while the agent runs, and that tmpfs remounted read-only. In every
case a caller gets AUDIT_UNAVAILABLE (a fixed message; the agent itself names
the file and the cause), the counting write capability never runs, the agent
keeps refusing, and after the trouble is gone a restarted agent finds an intact chain and serves again. The
same full disk under the idempotency store (the agent's ``state_dir``) is
covered too: an exactly-once write whose record cannot be kept must not run.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditRecord, query_records, verify_chain
from gateway.client.peer_client import PeerClient
from gateway.errors import AuditUnavailable, GatewayError, StateUnavailable
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from tests.helpers.agent_process import REPO, write_agent_toml
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)

TINY_FS_BYTES = 1024 * 1024
LOCKED_CALL_TIMEOUT = 20.0  # the agent waits busy_timeout_ms (5 s) for the lock, then fails


def _mount_tmpfs(where: Path) -> str | None:
    """Mount a tiny tmpfs at ``where``; the reason it cannot be done, else None."""
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TINY_FS_BYTES},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[0]
        return f"mount -t tmpfs is not permitted here: {why}"
    return None


def _remount(where: Path, mode: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,{mode}", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def _umount(where: Path) -> None:
    result = subprocess.run(["umount", str(where)], capture_output=True, timeout=30, check=False)
    if result.returncode != 0:  # something still holds a file open: detach it anyway
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards even if the test fails."""
    where = tmp_path / "tiny"
    where.mkdir()
    if reason := _mount_tmpfs(where):
        pytest.skip(reason)
    try:
        yield where
    finally:
        _umount(where)


def _fill(folder: Path) -> Path:
    """Write a file until the filesystem has no page left; returns it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (64 * 1024, 4096, 1):
            chunk = b"\0" * size
            for _ in range(TINY_FS_BYTES // size + 8):  # bounded: the fs holds less than this
                try:
                    if os.write(fd, chunk) < size:
                        break
                except OSError as err:
                    assert err.errno == errno.ENOSPC, err
                    break
    finally:
        os.close(fd)
    return filler


def _policy(tmp_path: Path) -> Path:
    return write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", ["text.echo", "notes.write"])],  # mallory has no grant
    )


async def _agent(
    pki: Pki,
    tmp_path: Path,
    audit_db: Path,
    counter: WriteCounter,
    state_dir: Path | None = None,
) -> Agent:
    config = agent_config(pki, tmp_path, "alice", _policy(tmp_path)).model_copy(
        update={"audit_db": audit_db, "state_dir": state_dir or tmp_path / "alice-state"}
    )
    return await started(config, standard_registry(counter, tmp_path / "alice-state"))


def _client(pki: Pki, agent: Agent, name: str) -> PeerClient:
    return PeerClient(agent.config.id, agent.address, pki.material(name))


async def _refused(
    client: PeerClient, capability: str, payload: dict[str, Any], timeout: float = 10.0
) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await client.invoke(capability, payload, timeout=timeout)
    return info.value


def _probe_record() -> AuditRecord:
    return AuditRecord(
        time_unix_ms=0, request_id="probe", peer_id="", capability="", version_constraint="",
        served_version="", decision="refuse", reason="INVALID_REQUEST", payload_size=0,
        payload_sha256="", latency_ms=0.0,
    )  # fmt: skip


async def _assert_refuses_all_work(
    pki: Pki, agent: Agent, counter: WriteCounter, cause: str, first_timeout: float = 10.0
) -> None:
    """A refusal can't be recorded: AUDIT_UNAVAILABLE with the fixed message (the agent
    itself names the file and ``cause``); then no work runs."""
    async with _client(pki, agent, "mallory") as mallory, _client(pki, agent, "bob") as bob:
        err = await _refused(mallory, "text.echo", {"text": "x"}, timeout=first_timeout)
        assert type(err) is AuditUnavailable, err
        assert err.message == AuditUnavailable.REMOTE_MESSAGE, err.message
        with pytest.raises(AuditUnavailable) as local:
            agent.audit.record(_probe_record())
        assert str(agent.config.audit_db) in local.value.message, local.value.message
        assert cause in local.value.message, local.value.message
        for _ in range(3):
            for capability, payload in (
                ("notes.write", {"note": "x"}),
                ("text.echo", {"text": "x"}),
            ):
                err = await _refused(bob, capability, payload)
                assert type(err) is AuditUnavailable, err
                assert err.message == AuditUnavailable.REMOTE_MESSAGE, err
    assert counter.calls == 0
    assert not agent.audit.healthy


async def _restart_serves(pki: Pki, tmp_path: Path, audit_db: Path) -> None:
    """After the trouble: the chain verifies and a fresh agent on the same files works."""
    report = verify_chain(open_audit_reader(audit_db))
    assert report.ok, report.problems
    counter = WriteCounter()
    agent = await _agent(pki, tmp_path, audit_db, counter)
    try:
        async with _client(pki, agent, "bob") as bob:
            result = await bob.invoke("notes.write", {"note": "after"}, timeout=10.0)
        assert result.output() == {"stored": 1} and counter.calls == 1
    finally:
        await agent.stop()
    assert verify_chain(open_audit_reader(audit_db)).ok


async def test_locked_database_fails_closed_and_says_why(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    db = tmp_path / "alice-audit.sqlite"
    agent = await _agent(pki, tmp_path, db, counter)
    locker = sqlite3.connect(db, isolation_level=None, timeout=5.0)
    try:
        async with _client(pki, agent, "bob") as bob:
            await bob.invoke("text.echo", {"text": "before"}, timeout=10.0)
        await agent.audit.flush()
        locker.execute("BEGIN EXCLUSIVE")
        await _assert_refuses_all_work(
            pki, agent, counter, "database is locked", first_timeout=LOCKED_CALL_TIMEOUT
        )
        locker.execute("ROLLBACK")
        # The lock is gone: the log reopens (audit_retry_seconds) and records again.
        for _ in range(200):  # bounded: at most ~20 s on a loaded machine
            if agent.audit.healthy:
                break
            await asyncio.sleep(0.1)
        assert agent.audit.healthy
        async with _client(pki, agent, "bob") as bob:
            result = await bob.invoke("notes.write", {"note": "after"}, timeout=10.0)
        assert result.output() == {"stored": 1} and counter.calls == 1
    finally:
        locker.close()
        await agent.stop()
    await _restart_serves(pki, tmp_path, db)


async def test_calls_answered_while_locked_keep_their_records(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    """Allowed reads answered before the failed commit are written once the lock is gone."""
    db = tmp_path / "alice-audit.sqlite"
    agent = await _agent(pki, tmp_path, db, counter)
    locker = sqlite3.connect(db, isolation_level=None, timeout=5.0)
    answered = [f"locked-{n}" for n in range(3)]
    try:
        locker.execute("BEGIN EXCLUSIVE")
        async with _client(pki, agent, "bob") as bob:
            for request_id in answered:
                result = await bob.invoke(
                    "text.echo", {"text": "x"}, request_id=request_id, timeout=10.0
                )
                assert result.output() == {"text": "x"}
        for _ in range(200):  # bounded: the commit fails after busy_timeout_ms (5 s)
            if not agent.audit.healthy:
                break
            await asyncio.sleep(0.1)
        assert not agent.audit.healthy
        locker.execute("ROLLBACK")
        for _ in range(200):  # bounded: reopened every audit_retry_seconds
            if agent.audit.healthy:
                break
            await asyncio.sleep(0.1)
        assert agent.audit.healthy
        await agent.audit.flush()
    finally:
        locker.close()
        await agent.stop()
    ids = [r.request_id for r in query_records(open_audit_reader(db))]
    assert sorted(i for i in ids if i in answered) == answered, ids
    report = verify_chain(open_audit_reader(db))
    assert report.ok, report.problems


async def test_full_disk_fails_closed_and_says_why(
    pki: Pki, tmp_path: Path, tiny_fs: Path, counter: WriteCounter
) -> None:
    db = tiny_fs / "alice-audit.sqlite"
    agent = await _agent(pki, tmp_path, db, counter)
    try:
        async with _client(pki, agent, "bob") as bob:
            await bob.invoke("text.echo", {"text": "before"}, timeout=10.0)
        await agent.audit.flush()
        filler = _fill(tiny_fs)
        await _assert_refuses_all_work(pki, agent, counter, "database or disk is full")
        filler.unlink()
        async with _client(pki, agent, "bob") as bob:
            err = await _refused(bob, "notes.write", {"note": "x"})
        assert type(err) is AuditUnavailable and counter.calls == 0
    finally:
        await agent.stop()
    await _restart_serves(pki, tmp_path, db)


async def test_first_write_after_the_disk_fills_is_not_run_unaudited(
    pki: Pki, tmp_path: Path, tiny_fs: Path, counter: WriteCounter
) -> None:
    db = tiny_fs / "alice-audit.sqlite"
    agent = await _agent(pki, tmp_path, db, counter)
    try:
        async with _client(pki, agent, "bob") as bob:
            await bob.invoke("text.echo", {"text": "before"}, timeout=10.0)
            await agent.audit.flush()
            _fill(tiny_fs)
            outcome: object
            try:
                outcome = await bob.invoke("notes.write", {"note": "unaudited?"}, timeout=10.0)
            except GatewayError as err:
                outcome = err
        assert isinstance(outcome, AuditUnavailable), (
            f"answered {outcome!r} without an audit record"
        )
        assert counter.calls == 0, "the write ran although it could not be audited"
    finally:
        await agent.stop()


async def test_full_disk_under_the_idempotency_store_fails_closed(
    pki: Pki, tmp_path: Path, tiny_fs: Path, counter: WriteCounter
) -> None:
    db = tmp_path / "alice-audit.sqlite"
    agent = await _agent(pki, tmp_path, db, counter, state_dir=tiny_fs / "alice-state")
    try:
        async with _client(pki, agent, "bob") as bob:
            await bob.invoke("notes.write", {"note": "a"}, idempotency_key="k-a", timeout=10.0)
            _fill(tiny_fs)
            with pytest.raises(GatewayError) as info:
                await bob.invoke(
                    "notes.write",
                    {"note": "b"},
                    idempotency_key="k-b",
                    request_id="full-b",
                    timeout=10.0,
                )
        await agent.audit.flush()
        assert type(info.value) is StateUnavailable, info.value
        assert counter.calls == 1, "the write ran although its idempotency record cannot be kept"
        assert "full-b" in {r.request_id for r in query_records(open_audit_reader(db))}, (
            "the call is not audited"
        )
    finally:
        await agent.stop()


async def test_read_only_audit_storage_refuses_to_serve_and_says_why(
    pki: Pki, tmp_path: Path, tiny_fs: Path, counter: WriteCounter
) -> None:
    """A running agent cannot be moved onto read-only storage (the kernel refuses to remount
    a filesystem with files open for writing), so this is the restart onto one."""
    db = tiny_fs / "alice-audit.sqlite"
    agent = await _agent(pki, tmp_path, db, counter)
    try:
        async with _client(pki, agent, "bob") as bob:
            await bob.invoke("text.echo", {"text": "before"}, timeout=10.0)
    finally:
        await agent.stop()
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=agent.config.policy,
        audit_db=db,
        state_dir=tmp_path / "alice-state",
    )
    _remount(tiny_fs, "ro")
    try:
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            check=False,
        )
    finally:
        _remount(tiny_fs, "rw")
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "serving on" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("refused: AUDIT_UNAVAILABLE: ") and str(db) in lines[0], lines
    report = verify_chain(open_audit_reader(db))
    assert report.ok and report.records == 1, report
