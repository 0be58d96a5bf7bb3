"""Per-peer limits and the server cap in the table workers share (``limits.table``).

Two table objects on one file stand in for two workers in the first tests
(each is its own open file with its own ``flock``, as in two processes); later
ones run real child processes on one file: contention for one bucket, places
held by a worker that is SIGKILLed and freed when it is restarted.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import ConcurrencyLimited, RateLimited, ServerBusy, StateUnavailable
from gateway.inbound.limits.admission import CallSlot
from gateway.inbound.limits.shared_table import (
    LIMITS_FILE,
    PROBE_LIMIT,
    LimitTable,
    create_limit_file,
)
from policies.grants import PeerGrant
from tests.helpers.agent_process import REPO
from tests.helpers.limits import FakeClock, peer_grant

BOB = "spiffe://example.org/agent/bob"
NO_REFILL = 0.0001  # one token per ~3 hours: no refill during a test
CHILD_TIMEOUT_SECONDS = 60  # a bound for a slow runner, never asserted


def _tables(path: Path, workers: int = 2, cap: int = 256, **kwargs: Any) -> list[LimitTable]:
    create_limit_file(path, workers, **kwargs)
    clock = FakeClock()
    return [LimitTable(path, index, workers, cap, clock=clock) for index in range(workers)]


def _outcome(table: LimitTable, grant: PeerGrant, peer: str = BOB) -> str:
    try:
        table.acquire(peer, grant)
    except (RateLimited, ConcurrencyLimited, ServerBusy) as err:
        return err.reason
    return "OK"


def test_two_workers_take_from_one_bucket(tmp_path: Path) -> None:
    first, second = _tables(tmp_path / LIMITS_FILE)
    grant = peer_grant(max_calls_per_second=NO_REFILL, burst=5)
    try:
        outcomes = [_outcome(table, grant) for _ in range(6) for table in (first, second)]
        assert outcomes == ["OK"] * 5 + ["RATE_LIMITED"] * 7
        assert dict(first.stats().rate_limited) == {BOB: 3}  # refusals: per worker
        assert dict(second.stats().rate_limited) == {BOB: 4}
        assert first.stats().in_flight_total == second.stats().in_flight_total == 5
        assert dict(second.stats().in_flight) == {BOB: 5}  # in flight: all workers
    finally:
        first.close()
        second.close()


def test_the_bucket_refills_at_the_rate_for_all_workers(tmp_path: Path) -> None:
    path = tmp_path / LIMITS_FILE
    create_limit_file(path, 2)
    clock = FakeClock()
    first, second = (LimitTable(path, n, 2, 256, clock=clock) for n in range(2))
    grant = peer_grant(max_calls_per_second=2.0, burst=2)
    try:
        assert [_outcome(first, grant), _outcome(second, grant)] == ["OK", "OK"]
        assert _outcome(second, grant) == "RATE_LIMITED"
        clock.now += 0.5  # one token at 2 per second, taken by whichever worker asks first
        assert [_outcome(second, grant), _outcome(first, grant)] == ["OK", "RATE_LIMITED"]
        clock.now += 60  # never more than the bucket holds
        outcomes = [_outcome(table, grant) for table in (first, second, first)]
        assert outcomes == ["OK", "OK", "RATE_LIMITED"]
    finally:
        first.close()
        second.close()


def test_a_policy_change_rebuilds_the_bucket(tmp_path: Path) -> None:
    first, second = _tables(tmp_path / LIMITS_FILE)
    try:
        small = peer_grant(max_calls_per_second=NO_REFILL, burst=2)
        assert [_outcome(first, small) for _ in range(3)] == ["OK", "OK", "RATE_LIMITED"]
        larger = peer_grant(max_calls_per_second=NO_REFILL, burst=3)  # a reloaded policy
        outcomes = [_outcome(second, larger) for _ in range(4)]
        assert outcomes == ["OK"] * 3 + ["RATE_LIMITED"]
        faster = peer_grant(max_calls_per_second=2 * NO_REFILL, burst=3)  # rate alone changed
        assert [_outcome(first, faster) for _ in range(4)] == ["OK"] * 3 + ["RATE_LIMITED"]
        assert _outcome(second, peer_grant()) == "OK"  # no rate in the grant: no bucket asked
    finally:
        first.close()
        second.close()


def test_max_in_flight_and_the_server_cap_count_every_worker(tmp_path: Path) -> None:
    first, second = _tables(tmp_path / LIMITS_FILE, cap=3)
    two = peer_grant(max_in_flight=2)
    try:
        held: list[CallSlot] = [first.acquire(BOB, two), second.acquire(BOB, two)]
        with pytest.raises(ConcurrencyLimited, match="2 calls already running; limit 2"):
            first.acquire(BOB, two)
        held.append(second.acquire("spiffe://example.org/agent/carol", two))
        with pytest.raises(ServerBusy) as busy:
            first.acquire("spiffe://example.org/agent/dave", two)
        assert busy.value.reason == "SERVER_BUSY"
        assert dict(first.stats().server_busy) == {"spiffe://example.org/agent/dave": 1}
        held[0].release()
        held[0].release()  # twice is once
        assert second.stats().in_flight_total == 2
        held.append(second.acquire(BOB, two))  # the place worker 0 gave back
        assert dict(first.stats().in_flight) == {BOB: 2}
        for slot in held:
            slot.release()
        assert first.stats().in_flight_total == second.stats().in_flight_total == 0
        assert dict(first.stats().in_flight) == {}
    finally:
        first.close()
        second.close()


def test_make_room_counts_the_peers_calls_in_every_worker(tmp_path: Path) -> None:
    first, second = _tables(tmp_path / LIMITS_FILE)
    one, poll = peer_grant(max_in_flight=1), peer_grant()
    try:
        mine = first.acquire(BOB, poll)
        first.make_room(mine, one)  # alone: it fits
        other = second.acquire(BOB, poll)
        with pytest.raises(ConcurrencyLimited, match="1 calls already running; limit 1"):
            second.make_room(other, one)
        assert dict(second.stats().concurrency_limited) == {BOB: 1}
        assert first.stats().in_flight_total == 2  # a refused slot keeps its place
        other.release()
        mine.release()
        assert first.stats().in_flight_total == 0
    finally:
        first.close()
        second.close()


def test_a_full_table_refuses_with_state_unavailable_and_counts_nothing(tmp_path: Path) -> None:
    first, second = _tables(tmp_path / LIMITS_FILE, capacity=1)
    grant = peer_grant()
    bob_grant = peer_grant(max_calls_per_second=NO_REFILL, burst=1)
    try:
        assert _outcome(first, bob_grant) == "OK"
        first.release(BOB)  # nothing in flight, but its bucket is empty: kept
        held: list[CallSlot] = []
        with pytest.raises(StateUnavailable, match="limits table is full") as refused:
            for n in range(1000):
                held.append(second.acquire(f"spiffe://example.org/agent/p{n}", grant))
        assert refused.value.reason == "STATE_UNAVAILABLE"
        assert len(held) >= PROBE_LIMIT - 1  # a peer's run of slots was all busy
        assert first.stats().in_flight_total == len(held)  # the refused call took no place
        for slot in held:
            slot.release()
        late = f"spiffe://example.org/agent/p{len(held)}"
        assert _outcome(second, grant, late) == "OK"  # idle entries are reused
        assert _outcome(first, bob_grant) == "RATE_LIMITED"  # bob's empty bucket was not
    finally:
        first.close()
        second.close()


def test_files_that_are_not_this_table_are_refused(tmp_path: Path) -> None:
    path = tmp_path / LIMITS_FILE
    with pytest.raises(StateUnavailable, match="No such file"):
        LimitTable(path, 0, 2, 256)  # workers never make the file: the supervisor does
    path.write_bytes(b"SQLite format 3\x00" + bytes(200))
    with pytest.raises(StateUnavailable, match="not a limits table"):
        LimitTable(path, 0, 2, 256)
    create_limit_file(path, 3)
    with pytest.raises(StateUnavailable, match="made for 3 workers, not 2"):
        LimitTable(path, 0, 2, 256)
    with pytest.raises(StateUnavailable, match="no column for worker 3"):
        LimitTable(path, 3, 3, 256)
    os.truncate(path, 4096)
    with pytest.raises(StateUnavailable, match="truncated"):
        LimitTable(path, 0, 3, 256)
    create_limit_file(path, 2)  # the supervisor makes it anew, whatever was there
    table = LimitTable(path, 1, 2, 256)
    try:
        assert _outcome(table, peer_grant(max_calls_per_second=NO_REFILL, burst=1)) == "OK"
    finally:
        table.close()
    assert path.stat().st_mode & 0o777 == 0o600  # holds the digest key


def test_a_new_file_does_not_share_with_a_worker_still_on_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / LIMITS_FILE
    (old,) = _tables(path, workers=1)
    grant = peer_grant(max_calls_per_second=NO_REFILL, burst=1)
    try:
        assert _outcome(old, grant) == "OK"
        create_limit_file(path, 1)  # renamed over: the old mapping keeps the old file
        assert _outcome(old, grant) == "RATE_LIMITED"
        new = LimitTable(path, 0, 1, 256)
        try:
            assert _outcome(new, grant) == "OK"  # full buckets, as after a restart
        finally:
            new.close()
    finally:
        old.close()
    old.release(BOB)  # a call ending after stop(): ignored


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


_TAKE_ALL = """
import json, sys
from pathlib import Path
from gateway.errors import RateLimited
from gateway.inbound.limits.shared_table import LimitTable
from policies.grants import PeerGrant
table = LimitTable(Path(sys.argv[1]), int(sys.argv[2]), 2, 100_000)
grant = PeerGrant.model_validate(json.loads(sys.argv[3]))
print("ready", flush=True)
sys.stdin.readline()
admitted = 0
for _ in range(int(sys.argv[4])):
    try:
        table.acquire("spiffe://example.org/agent/bob", grant).release()
        admitted += 1
    except RateLimited:
        pass
print(admitted, flush=True)
"""


def _grant_json(**limits: Any) -> str:
    return json.dumps(peer_grant(**limits).model_dump(mode="json"))


def test_processes_taking_from_one_bucket_get_exactly_the_burst(tmp_path: Path) -> None:
    path = tmp_path / LIMITS_FILE
    create_limit_file(path, 2)
    grant = _grant_json(max_calls_per_second=NO_REFILL, burst=500)
    children = [_child(_TAKE_ALL, str(path), str(n), grant, "2000") for n in range(2)]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for child in children:  # both go at once: they contend for the lock
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        admitted = []
        for child in children:
            out, _ = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
            assert child.returncode == 0
            admitted.append(int(out))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert sum(admitted) == 500


_HOLD = """
import json, sys, time
from pathlib import Path
from gateway.inbound.limits.shared_table import LimitTable
from policies.grants import PeerGrant
table = LimitTable(Path(sys.argv[1]), 1, 2, 256)
grant = PeerGrant.model_validate(json.loads(sys.argv[2]))
held = [table.acquire("spiffe://example.org/agent/bob", grant) for _ in range(2)]
print("holding", flush=True)
time.sleep(600)
"""


def test_places_of_a_sigkilled_worker_are_freed_when_it_is_restarted(tmp_path: Path) -> None:
    path = tmp_path / LIMITS_FILE
    create_limit_file(path, 2)
    three = peer_grant(max_in_flight=3)
    survivor = LimitTable(path, 0, 2, 256)
    child = _child(_HOLD, str(path), _grant_json(max_in_flight=3))
    try:
        assert child.stdout is not None and child.stdout.readline() == "holding\n"
        mine = survivor.acquire(BOB, three)
        with pytest.raises(ConcurrencyLimited, match="3 calls already running; limit 3"):
            survivor.acquire(BOB, three)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=CHILD_TIMEOUT_SECONDS) == -signal.SIGKILL
        assert _outcome(survivor, three) == "CONCURRENCY_LIMITED"  # its places are still held
        assert survivor.stats().in_flight_total == 3
        restarted = LimitTable(path, 1, 2, 256)  # worker 1 again: it zeroes its column
        try:
            assert survivor.stats().in_flight_total == 1
            assert dict(survivor.stats().in_flight) == {BOB: 1}
            held = [survivor.acquire(BOB, three), restarted.acquire(BOB, three)]
            assert _outcome(restarted, three) == "CONCURRENCY_LIMITED"
            for slot in [mine, *held]:
                slot.release()
            assert restarted.stats().in_flight_total == 0
        finally:
            restarted.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        survivor.close()


_TOTALS_AT = 64  # after the header: one in-flight total per worker
_BUCKET_AT = 16  # in an entry: after the peer's digest; tokens, last take, rate, size
_COLUMNS_IN_ENTRY = 16 + 32


_WHAT = {
    "total": "in-flight total",
    "column": "peer in-flight count",
    "tokens": "bucket",
    "last": "bucket",
}


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("total", -100),  # summed with worker 0's, the server cap would never be reached
        ("total", 2**63 - 1),  # one more would not even fit
        ("total", 5),  # above the cap of 4: no worker admits past it
        ("column", -3),  # the peer's in-flight sum would stay under max_in_flight
        ("column", 1),  # a peer's call in worker 1, which runs none
        ("tokens", float("nan")),  # min(size, nan) is size: a full bucket
        ("tokens", 1e300),
        ("tokens", -1.0),
        ("last", float("inf")),
        ("last", float("nan")),
    ],
)
def test_hostile_values_in_the_file_refuse_and_admit_nothing(
    tmp_path: Path, where: str, value: float
) -> None:
    path = tmp_path / LIMITS_FILE
    first, second = _tables(path, cap=4)
    grant = peer_grant(max_calls_per_second=NO_REFILL, burst=5, max_in_flight=2)
    try:
        first.acquire(BOB, grant).release()  # bob's entry exists, his bucket is built
        entry = first._find(*first._home(BOB))
        assert entry > 0
        if where == "total":
            offset, packed = _TOTALS_AT + 8, struct.pack("<q", int(value))
        elif where == "column":
            offset, packed = entry + _COLUMNS_IN_ENTRY + 8, struct.pack("<q", int(value))
        else:
            offset = entry + _BUCKET_AT + (0 if where == "tokens" else 8)
            packed = struct.pack("<d", value)
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, packed, offset)
        finally:
            os.close(fd)
        before = path.read_bytes()
        for table in (first, second):
            with pytest.raises(StateUnavailable) as refused:
                table.acquire(BOB, grant)
            assert refused.value.reason == "STATE_UNAVAILABLE"
            assert str(tmp_path) not in refused.value.message  # the path is for the audit only
            assert f"implausible {_WHAT[where]} " in refused.value.detail
        assert path.read_bytes() == before, "a refused call changed the table"
    finally:
        first.close()
        second.close()
