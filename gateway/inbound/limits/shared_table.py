"""Per-peer limits and the server-wide cap in a file the workers of one agent share.

With ``workers > 1`` every worker admits calls against one table,
``state_dir/limits.table``, memory-mapped (``MAP_SHARED``), so a grant's rate
and ``max_in_flight`` and the agent's ``max_concurrent_calls`` hold across all
workers exactly as in one process (``gateway.inbound.limits.admission.PeerCallLimits``).

Layout: a header (magic, version, entry size, slot count, worker columns,
digest key), then one in-flight total per worker (the server-wide count is
their sum), then fixed-size entries in an open-addressing table keyed by a
128-bit keyed BLAKE2b digest of the peer's SPIFFE id. An entry holds the
peer's token bucket (tokens; time of the last take on ``time.monotonic``:
CLOCK_MONOTONIC is one clock for the whole machine; the rate and size it was
built with, so a policy change rebuilds it as ``PeerCallLimits`` does) and the
peer's calls in flight, one column per worker.

Every call takes the table's ``flock`` twice (admit, release), inline on the
event loop: no thread hop; the lock is held for a few microseconds. The
columns exist for crashes: a worker SIGKILLed while holding places cannot give
them back, so a worker that starts (or is restarted with the same index)
zeroes its own column and its total under the lock.

Capacity: only peers with a grant reach the limits, so the table is bounded
by the policy. A peer's entry lives within ``PROBE_LIMIT`` slots of its home;
an entry that holds nothing (no call in flight, its bucket refilled to full)
is indistinguishable from a new one and is reused for another peer. No free or
reusable slot: the call is refused with ``StateUnavailable`` (fail closed),
never admitted without being counted. The same for values no worker writes
(a negative or out-of-range count, a bucket outside ``[0, size]`` or not a
number): whoever wrote them, admitting on them could exceed a cap.

The supervisor makes the file anew before the first worker starts
(:func:`create_limit_file`: a restart of the agent starts with full buckets,
as one process does). A worker only opens it: a missing file, another kind of
file or one made for another number of workers is refused (``StateUnavailable``;
the worker does not start).
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import secrets
import struct
import threading
import time
from enum import Enum
from pathlib import Path

from gateway.errors import ConcurrencyLimited, RateLimited, ServerBusy, StateUnavailable
from gateway.inbound.limits.admission import CallSlot, Clock, LimitStats, RefusalCounts
from gateway.local.private_files import PRIVATE_FILE
from policies.grants import PeerGrant

LIMITS_FILE = "limits.table"
"""The workers' table, in ``state_dir``."""
DEFAULT_PEER_CAPACITY = 4096
"""Peers the table is sized for (twice as many slots)."""
PROBE_LIMIT = 32
"""Most slots walked to find a peer; with at most half the slots used, a run this long is rare."""

_MAGIC = b"A2AGW-LT"
_VERSION = 1
_HEADER = struct.Struct("<8sIIII16s")  # magic, version, entry size, slots, workers, digest key
_HEADER_BYTES = 64
_DIGEST_BYTES = 16
_EMPTY = bytes(_DIGEST_BYTES)
_BUCKET = struct.Struct("<dddq")  # tokens, last take (monotonic s), rate and size built with
_COLUMNS_AT = _DIGEST_BYTES + _BUCKET.size
_COUNT = struct.Struct("<q")


class _Refusal(Enum):
    RATE = RateLimited.reason
    CONCURRENCY = ConcurrencyLimited.reason
    SERVER = ServerBusy.reason


class LimitTable:
    """``AdmissionControl`` over the file the workers share (see the module docstring).

    Args:
        path: ``state_dir/limits.table``, made by :func:`create_limit_file`.
        worker: This worker's index (its column).
        workers: Worker count the agent runs with (the file must be made for it).
        max_concurrent_calls: The server-wide cap, all workers together.
        clock: Monotonic seconds, the same clock in every worker (tests inject one).

    Raises:
        StateUnavailable: the file is missing, cannot be mapped or locked, or is
            not a limits table for ``workers`` workers.
    """

    def __init__(
        self,
        path: Path,
        worker: int,
        workers: int,
        max_concurrent_calls: int,
        clock: Clock = time.monotonic,
    ) -> None:
        self.max_concurrent_calls = max_concurrent_calls
        self._path = path
        self._worker = worker
        self._clock = clock
        self._refused = RefusalCounts()
        self._homes: dict[str, tuple[bytes, int]] = {}  # peer id -> digest, home slot offset
        self._lock = threading.Lock()  # flock is per open file: threads take turns here
        self._closed = False
        if not 0 <= worker < workers:
            raise StateUnavailable(f"limits table {path}: no column for worker {worker}")
        try:
            self._fd = os.open(path, os.O_RDWR)
        except OSError as err:
            raise StateUnavailable(f"limits table {path}: {err}") from err
        try:
            self._key, slots, self._entry_bytes = _read_header(self._fd, workers)
            self._map = mmap.mmap(self._fd, _file_bytes(slots, workers, self._entry_bytes))
        except (OSError, ValueError) as err:
            os.close(self._fd)
            raise StateUnavailable(f"limits table {path}: {err}") from err
        self._mask = slots - 1
        self._workers = workers
        self._entries_at = _entries_at(workers)
        self._end = self._entries_at + (slots + PROBE_LIMIT) * self._entry_bytes
        self._columns = struct.Struct(f"<{workers}q")
        self._column_at = _COLUMNS_AT + worker * _COUNT.size
        self._total_at = _HEADER_BYTES + worker * _COUNT.size
        self._reset_own_column()

    def acquire(self, peer_id: str, grant: PeerGrant) -> CallSlot:
        """Admit one call of ``peer_id`` under ``grant`` (all workers), or raise the limit it hit.

        Same order as ``PeerCallLimits``: the peer's rate, its in-flight cap, the
        server's cap.

        Raises:
            RateLimited: the peer's bucket is empty.
            ConcurrencyLimited: the peer has ``max_in_flight`` calls running.
            ServerBusy: the agent runs ``max_concurrent_calls`` calls.
            StateUnavailable: no slot for the peer (table full) or no lock.
        """
        digest, home = self._home(peer_id)
        self._take_lock()
        try:
            refusal, running = self._admit(self._entry(digest, home), grant)
        finally:
            self._drop_lock()
        if refusal is None:
            return CallSlot(self, peer_id)
        self._refused.count(refusal.value, peer_id)
        if refusal is _Refusal.RATE:
            raise RateLimited(f"over {grant.max_calls_per_second:g} calls per second")
        if refusal is _Refusal.CONCURRENCY:
            raise ConcurrencyLimited(
                f"{running} calls already running; limit {grant.max_in_flight}"
            )
        raise ServerBusy("the agent is running as many calls as it accepts; retry later")

    def make_room(self, slot: CallSlot, grant: PeerGrant) -> None:
        """Require room under ``grant.max_in_flight`` (all workers) for the call ``slot`` counts.

        Raises:
            ConcurrencyLimited: the peer's other calls fill ``max_in_flight``.
            StateUnavailable: the file could not be locked.
        """
        if grant.max_in_flight is None:
            return
        digest, home = self._home(slot.peer_id)
        self._take_lock()
        try:
            entry = self._find(digest, home)
            running = 1  # the slot's own place, if the entry were gone
            if entry >= 0:
                running = sum(self._columns.unpack_from(self._map, entry + _COLUMNS_AT))
        finally:
            self._drop_lock()
        if running - 1 >= grant.max_in_flight:
            self._refused.count(_Refusal.CONCURRENCY.value, slot.peer_id)
            raise ConcurrencyLimited(
                f"{running - 1} calls already running; limit {grant.max_in_flight}"
            )

    def release(self, peer_id: str) -> None:
        """One call of ``peer_id`` ended (use :meth:`CallSlot.release`).

        Raises:
            StateUnavailable: the file could not be locked (the place stays taken).
        """
        digest, home = self._home(peer_id)
        with self._lock:
            if self._closed:  # a call cancelled after stop(): the file is closed
                return
            self._flock(fcntl.LOCK_EX)
            try:
                entry = self._find(digest, home)
                if entry >= 0:
                    _decrement(self._map, entry + self._column_at)
                _decrement(self._map, self._total_at)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def stats(self) -> LimitStats:
        """Refusals counted by this worker; calls in flight of all workers.

        Per peer, in flight lists the peers this worker has admitted or refused
        since it started (the table keys peers by digest, not by name).

        Raises:
            StateUnavailable: the file could not be locked.
        """
        in_flight: dict[str, int] = {}
        self._take_lock()
        try:
            total = sum(self._columns.unpack_from(self._map, _HEADER_BYTES))
            for peer_id, (digest, home) in self._homes.items():
                entry = self._find(digest, home)
                if entry >= 0:
                    running = sum(self._columns.unpack_from(self._map, entry + _COLUMNS_AT))
                    if running > 0:
                        in_flight[peer_id] = running
        finally:
            self._drop_lock()
        return self._refused.stats(in_flight, total, self.max_concurrent_calls)

    def close(self) -> None:
        """Unmap and close the file; later releases are ignored."""
        with self._lock:
            self._closed = True
            self._map.close()
            os.close(self._fd)

    def _admit(self, entry: int, grant: PeerGrant) -> tuple[_Refusal | None, int]:
        """The locked part of :meth:`acquire`: (refusal or None, the peer's calls running)."""
        table = self._map
        columns = self._columns.unpack_from(table, entry + _COLUMNS_AT)
        totals = self._columns.unpack_from(table, _HEADER_BYTES)
        self._check_counts(columns, totals)
        if grant.max_calls_per_second is not None:
            rate, size = grant.max_calls_per_second, grant.bucket_size
            now = self._clock()  # read under the lock: takes are ordered like their times
            tokens, last, built_rate, built_size = _BUCKET.unpack_from(table, entry + _DIGEST_BYTES)
            if built_rate != rate or built_size != size:  # new peer or a new policy
                tokens, last = float(size), now
            elif not (0.0 <= tokens <= size and math.isfinite(last)):  # NaN fails both
                raise self._implausible("bucket", tokens)
            tokens = min(size, tokens + max(0.0, now - last) * rate)
            taken = tokens >= 1.0
            _BUCKET.pack_into(
                table, entry + _DIGEST_BYTES, tokens - 1.0 if taken else tokens, now, rate, size
            )
            if not taken:
                return _Refusal.RATE, 0
        running = sum(columns)
        if grant.max_in_flight is not None and running >= grant.max_in_flight:
            return _Refusal.CONCURRENCY, running
        if sum(totals) >= self.max_concurrent_calls:
            return _Refusal.SERVER, running
        _COUNT.pack_into(table, entry + self._column_at, columns[self._worker] + 1)
        _COUNT.pack_into(table, self._total_at, totals[self._worker] + 1)
        return None, running

    def _check_counts(self, columns: tuple[int, ...], totals: tuple[int, ...]) -> None:
        """Refuse counts no worker could have written (locked).

        A worker's total is at most the server cap, and a peer's calls in one
        worker are part of that worker's total. Anything else (negative, huge,
        a peer above its worker's total) means the file was written by someone
        else: admitting on it could exceed a cap, so the call is refused.

        Raises:
            StateUnavailable: a count is out of range.
        """
        for column, total in zip(columns, totals, strict=True):
            if not 0 <= total <= self.max_concurrent_calls:
                raise self._implausible("in-flight total", total)
            if not 0 <= column <= total:
                raise self._implausible("peer in-flight count", column)

    def _implausible(self, what: str, value: float) -> StateUnavailable:
        return StateUnavailable(
            "limits table holds values no worker writes; refusing rather than "
            "admitting a call it cannot count",
            detail=f"{self._path}: implausible {what} {value!r}",
        )

    def _home(self, peer_id: str) -> tuple[bytes, int]:
        """(digest, home slot offset) of ``peer_id``, remembered per peer."""
        known = self._homes.get(peer_id)
        if known is None:
            digest = hashlib.blake2b(
                peer_id.encode(), digest_size=_DIGEST_BYTES, key=self._key
            ).digest()
            slot = int.from_bytes(digest[:8], "little") & self._mask
            known = digest, self._entries_at + slot * self._entry_bytes
            self._homes[peer_id] = known
        return known

    def _find(self, digest: bytes, home: int) -> int:
        """Offset of the entry holding ``digest``; -1 if there is none (locked)."""
        table, at = self._map, home
        for _ in range(PROBE_LIMIT):
            stored = table[at : at + _DIGEST_BYTES]
            if stored == digest:
                return at
            if stored == _EMPTY:  # entries are never emptied: the peer is not further on
                return -1
            at += self._entry_bytes
        return -1

    def _entry(self, digest: bytes, home: int) -> int:
        """Offset of the entry for ``digest``, made in a free or idle slot if new (locked).

        Raises:
            StateUnavailable: every slot within ``PROBE_LIMIT`` holds a busy peer.
        """
        table, at, idle = self._map, home, -1
        for _ in range(PROBE_LIMIT):
            stored = table[at : at + _DIGEST_BYTES]
            if stored == digest:
                return at
            if stored == _EMPTY:
                break
            if idle < 0 and self._is_idle(at):
                idle = at
            at += self._entry_bytes
        else:
            if idle < 0:
                raise StateUnavailable(
                    f"limits table is full near this peer (capacity {(self._mask + 1) // 2} "
                    "peers); refusing rather than admitting a call it cannot count",
                    detail=str(self._path),
                )
        at = idle if idle >= 0 else at
        table[at : at + self._entry_bytes] = digest + bytes(self._entry_bytes - _DIGEST_BYTES)
        return at

    def _is_idle(self, entry: int) -> bool:
        """No call in flight and a full bucket: the entry is as good as new (locked)."""
        if any(self._columns.unpack_from(self._map, entry + _COLUMNS_AT)):
            return False
        tokens, last, rate, size = _BUCKET.unpack_from(self._map, entry + _DIGEST_BYTES)
        return bool(size == 0 or tokens + max(0.0, self._clock() - last) * rate >= size)

    def _reset_own_column(self) -> None:
        """Zero this worker's in-flight counts: what a dead predecessor held is free."""
        self._take_lock()
        try:
            start = self._entries_at + self._column_at
            for at in range(start, self._end, self._entry_bytes):
                _COUNT.pack_into(self._map, at, 0)
            _COUNT.pack_into(self._map, self._total_at, 0)
        finally:
            self._drop_lock()

    def _take_lock(self) -> None:
        self._lock.acquire()
        try:
            if self._closed:
                raise StateUnavailable(f"limits table {self._path} is closed")
            self._flock(fcntl.LOCK_EX)
        except BaseException:
            self._lock.release()
            raise

    def _drop_lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _flock(self, operation: int) -> None:
        try:
            fcntl.flock(self._fd, operation)
        except OSError as err:
            raise StateUnavailable(f"limits table {self._path}: {err}") from err


def create_limit_file(path: Path, workers: int, capacity: int = DEFAULT_PEER_CAPACITY) -> None:
    """Make the table at ``path`` anew for ``workers`` workers: full buckets, nothing in flight.

    Only while no worker runs (the supervisor, before the first one starts).
    Written beside and renamed over, so a worker of an earlier run still
    mapping the old file never writes into the new one.

    Raises:
        StateUnavailable: the file cannot be written.
    """
    slots = _slots_for(capacity)
    entry_bytes = _entry_bytes(workers)
    fresh = path.with_name(path.name + ".new")
    try:
        fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            os.fchmod(fd, PRIVATE_FILE)  # a leftover .new keeps its mode through O_CREAT
            os.ftruncate(fd, _file_bytes(slots, workers, entry_bytes))  # sparse until used
            header = _HEADER.pack(
                _MAGIC, _VERSION, entry_bytes, slots, workers, secrets.token_bytes(16)
            )
            os.pwrite(fd, header, 0)
        finally:
            os.close(fd)
        os.replace(fresh, path)
    except OSError as err:
        raise StateUnavailable(f"limits table {path}: {err}") from err


def _read_header(fd: int, workers: int) -> tuple[bytes, int, int]:
    """(digest key, slots, entry size) of the table in ``fd``.

    Raises:
        ValueError: not a limits table, made for another worker count, or truncated.
    """
    header = os.pread(fd, _HEADER.size, 0)
    if len(header) < _HEADER.size:
        raise ValueError("not a limits table")
    magic, version, entry_bytes, slots, columns, key = _HEADER.unpack(header)
    if (magic, version) != (_MAGIC, _VERSION) or slots < 1 or slots & (slots - 1):
        raise ValueError("not a limits table")
    if columns != workers or entry_bytes != _entry_bytes(workers):
        raise ValueError(f"made for {columns} workers, not {workers}")
    if os.fstat(fd).st_size < _file_bytes(slots, workers, entry_bytes):
        raise ValueError("limits table file is truncated")
    return key, int(slots), int(entry_bytes)


def _decrement(table: mmap.mmap, at: int) -> None:
    _COUNT.pack_into(table, at, max(0, _COUNT.unpack_from(table, at)[0] - 1))


def _slots_for(capacity: int) -> int:
    """A power of two at least twice ``capacity`` (at most half the slots are used)."""
    return 1 << max(4, (2 * max(1, capacity) - 1).bit_length())


def _entry_bytes(workers: int) -> int:
    return _COLUMNS_AT + workers * _COUNT.size


def _entries_at(workers: int) -> int:
    return _HEADER_BYTES + workers * _COUNT.size


def _file_bytes(slots: int, workers: int, entry_bytes: int) -> int:
    return _entries_at(workers) + (slots + PROBE_LIMIT) * entry_bytes
