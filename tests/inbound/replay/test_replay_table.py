"""The replay window as a fixed-size table: in memory (one process) and in a
shared memory-mapped file (``workers > 1``).

Two window objects on one file stand in for two workers in the first tests;
later ones run real child processes on one file: concurrent sightings, a
SIGKILL while holding the lock, a SIGKILL after recording.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gateway.errors import StateUnavailable
from gateway.inbound.replay.mmap import REPLAY_FILE, ReplayTable, size_replay_file
from tests.helpers.agent_process import REPO

SECOND_NS = 1_000_000_000
CHILD_TIMEOUT_SECONDS = 60  # a bound for a slow runner, never asserted


class FakeClock:
    """Unix time in ns that a test moves by hand."""

    def __init__(self) -> None:
        self.now_ns = 1_700_000_000 * SECOND_NS  # in the past: real-clock windows see expiry

    def __call__(self) -> int:
        return self.now_ns


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )


async def test_request_id_seen_by_one_window_is_refused_by_the_other(tmp_path: Path) -> None:
    first, second = (ReplayTable(tmp_path / "replay.window") for _ in range(2))
    try:
        assert await first.first_seen("bob", "r1") is True
        assert await second.first_seen("bob", "r1") is False
        assert await first.first_seen("bob", "r1") is False
        assert await second.first_seen("carol", "r1") is True  # ids never cross peers
        assert await first.first_seen("bo", "br1") is True  # (peer, id) is not a concatenation
    finally:
        first.close()
        second.close()
    assert (tmp_path / "replay.window").stat().st_mode & 0o777 == 0o600  # holds the digest key


async def test_an_id_is_refused_until_its_window_ends_then_taken_once(tmp_path: Path) -> None:
    clock = FakeClock()
    window = ReplayTable(tmp_path / "replay.window", window_seconds=600.0, clock_ns=clock)
    try:
        assert window.sight("bob", "r1") is True
        clock.now_ns += 599 * SECOND_NS
        assert window.sight("bob", "r1") is False
        clock.now_ns += 1 * SECOND_NS  # the window is over: the id is free again, once
        assert window.sight("bob", "r1") is True
        assert window.sight("bob", "r1") is False
    finally:
        window.close()


async def test_preloaded_ids_stay_refused_and_expired_ones_are_free(tmp_path: Path) -> None:
    clock = FakeClock()
    window = ReplayTable(tmp_path / "replay.window", window_seconds=600.0, clock_ns=clock)
    try:
        window.preload([("bob", "old", 30.0), ("bob", "gone", 900.0), ("bob", "", 1.0)])
        window.preload([("bob", "old", 30.0)])  # every worker seeds: twice changes nothing
        assert await window.first_seen("bob", "old") is False
        assert await window.first_seen("bob", "gone") is True
        assert await window.first_seen("bob", "") is True  # an empty id was never stored
        clock.now_ns += 570 * SECOND_NS  # "old" was seen 30 s before the preload
        assert await window.first_seen("bob", "old") is True
    finally:
        window.close()
    zero = ReplayTable(tmp_path / "replay.window", window_seconds=0.0)
    try:  # a zero window remembers nothing: the id is taken over at once
        assert await zero.first_seen("bob", "old") is True
        assert await zero.first_seen("bob", "old") is True
    finally:
        zero.close()


async def test_a_full_table_refuses_new_ids_and_forgets_none(tmp_path: Path) -> None:
    clock = FakeClock()
    window = ReplayTable(
        tmp_path / "replay.window", window_seconds=600.0, capacity=8, clock_ns=clock
    )
    try:
        accepted: list[str] = []
        with pytest.raises(StateUnavailable, match="is full") as refused:
            for n in range(10_000):
                assert window.sight("bob", f"r{n}") is True
                accepted.append(f"r{n}")
        assert refused.value.reason == "STATE_UNAVAILABLE"
        assert len(accepted) >= 8  # at least the capacity asked for
        assert [window.sight("bob", rid) for rid in accepted] == [False] * len(accepted)
        with pytest.raises(
            StateUnavailable, match="is full"
        ):  # still full: the new id is not admitted
            window.sight("bob", f"r{len(accepted)}")
        clock.now_ns += 600 * SECOND_NS  # all expired: their slots take new ids
        assert window.sight("bob", f"r{len(accepted)}") is True
    finally:
        window.close()


def test_a_file_that_is_not_a_window_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "replay.window"
    path.write_bytes(b"SQLite format 3\x00" + bytes(200))
    with pytest.raises(StateUnavailable, match="not a replay window"):
        ReplayTable(path)
    torn = tmp_path / "torn.window"
    torn.write_bytes(bytes(64))  # its creator died before writing the header: set up anew
    window = ReplayTable(torn)
    try:
        assert window.sight("bob", "r1") is True
        assert window.sight("bob", "r1") is False
    finally:
        window.close()


_SIGHT_ALL = """
import sys
from pathlib import Path
from gateway.inbound.replay.mmap import REPLAY_FILE, ReplayTable, size_replay_file
window = ReplayTable(Path(sys.argv[1]))
ids = [f"r{n}" for n in range(int(sys.argv[2]))]
if sys.argv[3] == "backwards":
    ids.reverse()
print("\\n".join(rid for rid in ids if window.sight("spiffe://example.org/agent/bob", rid)))
"""


def test_concurrent_processes_accept_each_id_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "replay.window"
    ReplayTable(path).close()  # created once, as worker 0 does before the others
    ids = 3000
    children = [
        _child(_SIGHT_ALL, str(path), str(ids), order)
        for order in ("forwards", "backwards", "forwards")
    ]
    accepted: Counter[str] = Counter()
    for child in children:
        out, _ = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
        assert child.returncode == 0
        accepted.update(line for line in out.splitlines() if line)
    assert accepted == Counter({f"r{n}": 1 for n in range(ids)})


_RECORD_THEN_HOLD = """
import fcntl, os, sys, time
from pathlib import Path
from gateway.inbound.replay.mmap import REPLAY_FILE, ReplayTable, size_replay_file
window = ReplayTable(Path(sys.argv[1]))
assert window.sight("spiffe://example.org/agent/bob", "before-kill")
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)  # killed while holding the table's lock
print("holding", flush=True)
time.sleep(600)
"""


def test_a_worker_killed_holding_the_lock_leaves_its_ids_refused(tmp_path: Path) -> None:
    path = tmp_path / "replay.window"
    child = _child(_RECORD_THEN_HOLD, str(path))
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "holding\n"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=CHILD_TIMEOUT_SECONDS) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    survivor = ReplayTable(path)  # the kernel released the dead worker's lock
    try:
        assert survivor.sight("spiffe://example.org/agent/bob", "before-kill") is False
        assert survivor.sight("spiffe://example.org/agent/bob", "after-kill") is True
    finally:
        survivor.close()


async def test_in_memory_tables_are_separate_and_expire_on_their_clock() -> None:
    clock = FakeClock()
    first = ReplayTable(None, window_seconds=600.0, clock_ns=clock)
    second = ReplayTable(None, window_seconds=600.0, clock_ns=clock)
    try:
        assert await first.first_seen("bob", "r1") is True
        assert await first.first_seen("bob", "r1") is False
        assert await second.first_seen("bob", "r1") is True  # nothing shared without a file
        first.preload([("bob", "old", 30.0)])
        assert await first.first_seen("bob", "old") is False
        clock.now_ns += 600 * SECOND_NS
        assert await first.first_seen("bob", "r1") is True
        assert await first.first_seen("bob", "old") is True
    finally:
        first.close()
        second.close()


async def test_a_full_in_memory_table_refuses_and_never_forgets_a_live_id() -> None:
    # The window this table replaced dropped its oldest ids beyond max_entries,
    # so an early id could be replayed within the window after a flood.
    clock = FakeClock()
    window = ReplayTable(None, window_seconds=600.0, capacity=8, clock_ns=clock)
    try:
        accepted: list[str] = []
        with pytest.raises(StateUnavailable, match="in memory is full"):
            for n in range(10_000):
                assert window.sight("bob", f"r{n}") is True
                accepted.append(f"r{n}")
        assert len(accepted) >= 8
        assert [window.sight("bob", rid) for rid in accepted] == [False] * len(accepted)
        clock.now_ns += 600 * SECOND_NS
        assert window.sight("bob", accepted[0]) is True
    finally:
        window.close()


def test_the_in_memory_default_holds_two_million_ids() -> None:
    window = ReplayTable(None, window_seconds=600.0)
    try:
        assert window.sight("bob", "r1") is True
        assert window.sight("bob", "r1") is False
        assert window.max_entries >= 2_000_000
    finally:
        window.close()


def test_the_supervisor_makes_a_differently_sized_file_anew(tmp_path: Path) -> None:
    path = tmp_path / REPLAY_FILE
    assert size_replay_file(path, 1024) is False  # no file: nothing to do
    ReplayTable(path, capacity=1024).close()
    assert size_replay_file(path, 1024) is False  # its size: kept
    assert path.exists()
    assert size_replay_file(path, 4096) is True  # another size: removed
    assert not path.exists()
    table = ReplayTable(path, capacity=4096)
    try:
        assert table.max_entries >= 4096
    finally:
        table.close()
    path.write_bytes(b"not a table")
    assert size_replay_file(path, 4096) is True  # torn or foreign: removed too
