"""Every state file an agent creates is 0600 and its state folders 0700, whatever the umask.

The umask is 000 here (what a service manager may leave), so any file left
to SQLite's or the kernel's defaults would come out 0644 or wider. SQLite's
``-wal`` and ``-shm`` files take the database file's mode, so they are
checked too; files an earlier run left with a wider mode are tightened, by
their path: a file this process holds keeps its locks.
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.inbound.limits.shared_table import LIMITS_FILE, LimitTable, create_limit_file
from gateway.inbound.replay.mmap import REPLAY_FILE, ReplayTable
from gateway.local.private_files import connect_private, private_file
from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import A2APeer, data_request
from tests.helpers.agents import Pki, WriteCounter, agent_config, grant, mesh_registry, write_policy


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _with_side_files(databases: list[Path]) -> list[Path]:
    """Each database and those of its SQLite side files that exist."""
    candidates = [Path(f"{db}{suffix}") for db in databases for suffix in ("", "-wal", "-shm")]
    return [path for path in candidates if path.exists()]


def _modes(paths: list[Path]) -> dict[str, str]:
    return {path.name: oct(_mode(path)) for path in paths}


@pytest.mark.usefixtures("open_umask")
async def test_every_state_file_of_an_agent_is_private(pki: Pki, tmp_path: Path) -> None:
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    base = tmp_path / "new"
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write", "text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"audit_db": audit_dir / "alice-audit.sqlite", "state_dir": base / "state"}
    )
    state = config.state_dir
    state.mkdir(parents=True)
    (state / "idempotency.sqlite").touch()  # left by an earlier run, world-readable
    os.chmod(state / "idempotency.sqlite", 0o644)
    agent = Agent(config, mesh_registry(WriteCounter(), state))
    await agent.start(watch_policy=False)
    try:
        async with PeerClient(config.id, agent.address, pki.material("bob")) as bob:
            await bob.invoke("notes.write", {"note": "a"}, idempotency_key="k1")
        async with A2APeer(pki, agent, "bob") as peer:
            await peer.send(data_request("text.echo", {"text": "hi"}))
        await agent.audit.flush()
        databases = [
            config.audit_db,
            state / "idempotency.sqlite",
            state / "a2a-tasks.sqlite",
            state / "tasks.sqlite",
            state / "kv.sqlite",  # the built-in kv capability's own file
        ]
        files = _with_side_files(databases)
        assert set(databases) <= set(files), files
        assert {f"{db.name}-wal" for db in databases[:3]} <= {f.name for f in files}, files
        assert set(_modes(files).values()) == {"0o600"}, _modes(files)
    finally:
        await agent.stop()
    # Written at the graceful stop: the signed checkpoints, beside the audit log.
    checkpoints = Path(f"{config.audit_db}.checkpoints.jsonl")
    assert _modes([checkpoints]) == {checkpoints.name: "0o600"}


@pytest.mark.usefixtures("open_umask")
async def test_new_state_folders_are_0700_and_existing_ones_are_left_alone(
    pki: Pki, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    fresh = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"state_dir": tmp_path / "new" / "state"}
    )
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    existing = fresh.model_copy(update={"state_dir": shared})
    for config in (fresh, existing):
        # The test capabilities keep their files elsewhere: the agent makes its folder.
        agent = Agent(config, mesh_registry(WriteCounter(), tmp_path / "capabilities"))
        await agent.start(watch_policy=False)
        await agent.stop()
    assert _modes([tmp_path / "new", fresh.state_dir]) == {"new": "0o700", "state": "0o700"}
    assert _mode(shared) == 0o755  # not ours to change (e.g. /var/lib)
    assert set(_modes(list(shared.iterdir())).values()) == {"0o600"}


@pytest.mark.usefixtures("open_umask")
def test_the_instance_lock_is_private(tmp_path: Path) -> None:
    from gateway.runtime.instance_lock import InstanceLock

    lock = InstanceLock.acquire(tmp_path)
    try:
        assert _mode(lock.path) == 0o600
    finally:
        lock.release()


@pytest.mark.usefixtures("open_umask")
def test_the_workers_tables_are_private(tmp_path: Path) -> None:
    limits, replay = tmp_path / LIMITS_FILE, tmp_path / REPLAY_FILE
    leftover = limits.with_name(limits.name + ".new")
    leftover.write_bytes(b"")
    os.chmod(leftover, 0o644)  # a supervisor killed mid-write left it
    create_limit_file(limits, 2)
    table = LimitTable(limits, 0, 2, 8)
    table.close()
    replay.write_bytes(b"")
    os.chmod(replay, 0o644)
    window = ReplayTable(replay, capacity=64)
    window.close()
    fresh = ReplayTable(tmp_path / "other.window", capacity=64)
    fresh.close()
    assert _modes([limits, replay, tmp_path / "other.window"]) == {
        LIMITS_FILE: "0o600",
        REPLAY_FILE: "0o600",
        "other.window": "0o600",
    }


def _locked_elsewhere(path: Path) -> bool:
    """Whether another process finds ``path`` locked (it tries an exclusive POSIX lock)."""
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n"
        "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except OSError:\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(path)], timeout=30, check=False)
    return done.returncode == 3


def test_making_an_open_file_private_keeps_this_processs_locks_on_it(tmp_path: Path) -> None:
    # Closing any descriptor of a file drops every POSIX lock the process holds on
    # it: private_file must not open one that exists.
    path = tmp_path / "held.sqlite"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        private_file(path)
        assert _mode(path) == 0o600
        assert _locked_elsewhere(path)
    finally:
        os.close(fd)


def test_a_second_connection_of_this_process_keeps_the_first_ones_wal_alive(
    tmp_path: Path,
) -> None:
    # Found by an attack round: the audit writer reopened its log while the
    # console's feed held it; the reopen's private_file dropped the feed's locks
    # on the -shm file, another process closing its own connection took itself
    # for the last one and deleted -wal and -shm, and every record written
    # afterwards went to a deleted file (lost on a crash).
    path = tmp_path / "log.sqlite"
    feed = connect_private(path, isolation_level=None)
    feed.execute("PRAGMA journal_mode=WAL")
    feed.execute("CREATE TABLE t (n INTEGER)")
    feed.execute("INSERT INTO t VALUES (1)")
    assert feed.execute("SELECT COUNT(*) FROM t").fetchone() == (1,)
    writer = connect_private(path, isolation_level=None)
    try:
        outside = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM t'); c.close()"
        subprocess.run([sys.executable, "-c", outside, str(path)], timeout=30, check=True)
        writer.execute("INSERT INTO t VALUES (2)")
        count = "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM t').fetchone()[0])"
        seen = subprocess.run(
            [sys.executable, "-c", count, str(path)], timeout=30, check=True, capture_output=True
        )
        assert seen.stdout.strip() == b"2"
        assert Path(f"{path}-wal").exists()
    finally:
        writer.close()
        feed.close()
