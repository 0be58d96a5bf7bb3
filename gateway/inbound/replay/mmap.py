"""The replay window as a fixed-size table: in this process's memory, or in a
memory-mapped file the worker processes of one agent share.

The table is a fixed-size open-addressing table. A slot holds
a 128-bit keyed BLAKE2b digest of (peer, request id) and the time in ms
until which that pair is refused. A sighting hashes the pair, takes the
table's lock (with a file, also its ``flock``: held for a few microseconds,
inline on the event loop: no thread hop, no transaction) and walks at most
``PROBE_LIMIT`` slots from the pair's home slot (one read of the run of
slots; no wrap-around: the table has ``PROBE_LIMIT`` spare slots at its end):

* the digest in a live slot: the id was used within the window, by whichever
  worker -> refused;
* otherwise the pair takes the first slot that is free (never used or
  expired) and is remembered until now + window;
* no free slot within ``PROBE_LIMIT``: the table is full there. The call is
  refused with ``StateUnavailable`` (fail closed): an id is never admitted
  without being recorded, and a recorded id is never pushed out early.

A pair is only ever stored within ``PROBE_LIMIT`` slots of its home, and at
most once (an expired copy is reused in place).

One process (``path=None``): the table is anonymous memory (pages are only
taken as slots are used; 24 bytes a slot, two slots per id of capacity) and
times come from the monotonic clock. Workers (``state_dir/replay.window``):
the file is ``MAP_SHARED``, so what one worker wrote is seen by the others at
once and survives a crash of any worker (SIGKILL included; the kernel
releases its lock); times are Unix ms, the clock the workers share. A crash of
the machine may lose the file's unwritten pages. Either way every process
seeds the window from the audit log at start (``preload``). The digest key is
random per table (a file's is in its header, mode 0600), so a peer cannot
choose request ids that crowd one part of the table.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gateway.errors import StateUnavailable
from gateway.inbound.replay.store import DEFAULT_WINDOW_SECONDS, ReplayWindow
from gateway.local.private_files import PRIVATE_FILE, private_file

REPLAY_FILE = "replay.window"
"""The workers' table, in ``state_dir``."""
DEFAULT_CAPACITY = 1 << 21
"""Ids remembered at once by default (2 097 152: about 3 500 calls/s over a 600 s window)."""
PROBE_LIMIT = 64
"""Most slots walked per sighting; with at most half the slots live, a run this long is rare."""

_MAGIC = b"A2AGW-RW"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQ16s")  # magic, version, slot size, slot count, digest key
_HEADER_BYTES = 64
_SLOT = struct.Struct("<16sq")  # digest, refused until (ms on the clock; 0 = never used)
_UNTIL = struct.Struct("<q")
_RUN_BYTES = PROBE_LIMIT * _SLOT.size
_DIGEST_BYTES = 16


class ReplayTable(ReplayWindow):
    """``ReplayWindow`` in a fixed-size table, in memory or in a file workers share.

    See the module docstring.
    """

    # Not ``shared``: memory starts empty, and a file is new the first time
    # workers are configured (and may miss pages after a machine crash), so
    # each process seeds it from the audit log at start; seeding twice
    # changes nothing.
    shared = False

    def __init__(
        self,
        path: Path | None,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        capacity: int = DEFAULT_CAPACITY,
        clock_ns: Callable[[], int] | None = None,
    ) -> None:
        """Open the table at ``path`` (creating it, 2 x ``capacity`` slots, if the
        file is new), or make one in memory when ``path`` is None.

        An existing file keeps its own size. ``clock_ns`` is the time in ns
        (default: Unix time with a file, whose workers compare each other's
        stamps; the monotonic clock in memory).

        Raises:
            StateUnavailable: the file cannot be opened, created or mapped, or is
                not a replay window.
        """
        self._path = path
        self._window = window_seconds
        self._window_ms = int(window_seconds * 1000)
        self._lock = threading.Lock()  # flock is per open file: threads take turns here
        self._fd = -1
        if path is None:
            self._clock_ns = clock_ns or time.monotonic_ns
            self._key, self._slots = secrets.token_bytes(16), _slots_for(capacity)
            self._map = mmap.mmap(-1, _file_bytes(self._slots))  # anonymous, zero-filled
            self._mask = self._slots - 1
            return
        self._clock_ns = clock_ns or time.time_ns
        try:
            private_file(path)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        except OSError as err:
            raise StateUnavailable(f"replay window {path}: {err}") from err
        try:
            self._key, self._slots = _open_table(self._fd, _slots_for(capacity))
            self._map = mmap.mmap(self._fd, _file_bytes(self._slots))
        except (OSError, ValueError) as err:
            os.close(self._fd)
            raise StateUnavailable(f"replay window {path}: {err}") from err
        self._mask = self._slots - 1

    @property
    def window_seconds(self) -> float:
        return self._window

    @property
    def max_entries(self) -> int:
        return self._slots // 2

    async def first_seen(self, peer_id: str, request_id: str) -> bool:
        return self.sight(peer_id, request_id)

    def sight(self, peer_id: str, request_id: str) -> bool:
        """Record the pair now; False if it was seen within the window.

        Raises:
            StateUnavailable: no free slot for a new pair (the table is full:
                the call must not run), or the file could not be locked.
        """
        now_ms = self._clock_ns() // 1_000_000
        return self._remember(self._digest(peer_id, request_id), now_ms, now_ms + self._window_ms)

    def preload(self, entries: Iterable[tuple[str, str, float]]) -> None:
        """Seed from the audit log: (peer, request id, age in seconds); known ids are kept.

        Raises:
            StateUnavailable: the file could not be locked, or the table is full.
        """
        now_ms = self._clock_ns() // 1_000_000
        for peer_id, request_id, age in entries:
            until_ms = now_ms - int(age * 1000) + self._window_ms
            if request_id and until_ms > now_ms:
                self._remember(self._digest(peer_id, request_id), now_ms, until_ms)

    def close(self) -> None:
        with self._lock:
            self._map.close()
            if self._fd >= 0:
                os.close(self._fd)

    def _digest(self, peer_id: str, request_id: str) -> bytes:
        peer = peer_id.encode()
        message = len(peer).to_bytes(4, "little") + peer + request_id.encode()
        return hashlib.blake2b(message, digest_size=_DIGEST_BYTES, key=self._key).digest()

    def _remember(self, digest: bytes, now_ms: int, until_ms: int) -> bool:
        """Store ``digest`` until ``until_ms``; False if it is live already (then unchanged)."""
        start = _HEADER_BYTES + (int.from_bytes(digest[:8], "little") & self._mask) * _SLOT.size
        with self._lock:
            if self._fd < 0:
                return self._store(start, digest, now_ms, until_ms)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as err:
                raise StateUnavailable(f"replay window {self._path}: {err}") from err
            try:
                return self._store(start, digest, now_ms, until_ms)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _store(self, start: int, digest: bytes, now_ms: int, until_ms: int) -> bool:
        """The locked part of :meth:`_remember`."""
        run = self._map[start : start + _RUN_BYTES]
        at = _slot_of(run, digest)
        if at >= 0:
            if _UNTIL.unpack_from(run, at + _DIGEST_BYTES)[0] > now_ms:
                return False
        else:
            at = _first_free(run, now_ms)
            if at < 0:
                where = "in memory" if self._path is None else str(self._path)
                raise StateUnavailable(
                    f"replay window {where} is full near this id "
                    f"(capacity {self._slots // 2}); refusing rather than forgetting ids"
                )
        _SLOT.pack_into(self._map, start + at, digest, until_ms)
        return True


def size_replay_file(path: Path, capacity: int) -> bool:
    """Remove the table at ``path`` if it is not sized for ``capacity``; True if removed.

    Only while no process has it open (the supervisor, before any worker
    starts): workers then make it anew at this size and reload the ids of the
    window from the audit log, as after any start.

    Raises:
        StateUnavailable: the file exists but cannot be read or removed.
    """
    try:
        with path.open("rb") as table:
            header = table.read(_HEADER.size)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise StateUnavailable(f"replay window {path}: {err}") from err
    if len(header) == _HEADER.size and _HEADER.unpack(header)[3] == _slots_for(capacity):
        return False
    try:
        path.unlink()
    except OSError as err:
        raise StateUnavailable(f"replay window {path}: {err}") from err
    return True


def _slot_of(run: bytes, digest: bytes) -> int:
    """Byte offset of the slot holding ``digest`` in ``run``; -1 if none does."""
    at = run.find(digest)
    while at >= 0 and at % _SLOT.size:  # a match across two slots is not a slot
        at = run.find(digest, at + 1)
    return at


def _first_free(run: bytes, now_ms: int) -> int:
    """Byte offset of the first never-used or expired slot in ``run``; -1 if all are live."""
    # Slot by slot: with at most half the table live, the home slot usually is free.
    for until_at in range(_DIGEST_BYTES, _RUN_BYTES, _SLOT.size):
        if _UNTIL.unpack_from(run, until_at)[0] <= now_ms:
            return until_at - _DIGEST_BYTES
    return -1


def _slots_for(capacity: int) -> int:
    """A power of two at least twice ``capacity`` (at most half the slots are live)."""
    return 1 << max(4, (2 * max(1, capacity) - 1).bit_length())


def _file_bytes(slots: int) -> int:
    return _HEADER_BYTES + (slots + PROBE_LIMIT) * _SLOT.size


def _open_table(fd: int, slots: int) -> tuple[bytes, int]:
    """(digest key, slot count) of the table in ``fd``; a new or torn file is set up first.

    Raises:
        ValueError: the file holds something else than a replay window.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        header = os.pread(fd, _HEADER.size, 0)
        if header.count(0) == len(header):  # new, or its creator died before the header
            os.ftruncate(fd, _file_bytes(slots))  # sparse: unused slots take no disk
            key = secrets.token_bytes(16)
            header = _HEADER.pack(_MAGIC, _VERSION, _SLOT.size, slots, key)
            os.pwrite(fd, header, 0)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
    if len(header) < _HEADER.size:
        raise ValueError("not a replay window file")
    magic, version, slot_bytes, slots, key = _HEADER.unpack(header)
    if (magic, version, slot_bytes) != (_MAGIC, _VERSION, _SLOT.size) or slots & (slots - 1):
        raise ValueError("not a replay window file")
    if os.fstat(fd).st_size < _file_bytes(slots):
        raise ValueError("replay window file is truncated")
    return key, int(slots)
