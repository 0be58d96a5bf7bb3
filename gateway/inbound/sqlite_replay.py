"""The replay window in a SQLite file, shared by the worker processes of one agent.

One row per (peer, request id). A sighting is one statement: insert the row,
or take over a row older than the window; if neither happened the id was used
within the window, by whichever worker. Old rows are deleted now and then by
the sighting itself. Used when ``workers > 1`` (one process keeps the window
in memory: :class:`gateway.inbound.replay.ReplayGuard`, cheaper by a thread
hop and a write per call).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from gateway.errors import StateUnavailable
from gateway.inbound.replay import DEFAULT_MAX_ENTRIES, DEFAULT_WINDOW_SECONDS, ReplayWindow

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS replay_window (peer TEXT NOT NULL, request_id TEXT NOT NULL, "
    "seen_unix_ms INTEGER NOT NULL, PRIMARY KEY (peer, request_id)) WITHOUT ROWID"
)
_SIGHT = (
    "INSERT INTO replay_window VALUES (?, ?, ?) "
    "ON CONFLICT (peer, request_id) DO UPDATE SET seen_unix_ms = excluded.seen_unix_ms "
    "WHERE replay_window.seen_unix_ms <= ? RETURNING 1"
)
_EXPIRE_EVERY = 1000
"""Sightings between two deletions of expired rows."""


class SqliteReplayWindow(ReplayWindow):
    """``ReplayWindow`` in ``replay.sqlite`` under the agent's state dir."""

    # Not ``shared``: the table starts empty the first time workers are
    # configured, so each worker still seeds it from the audit log at start
    # (INSERT OR IGNORE: seeding twice changes nothing).
    shared = False

    def __init__(
        self,
        path: Path,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._path = path
        self._window = window_seconds
        self._max = max_entries
        self._sightings = 0
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=10.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a sighting survives a crash of the process (what replay
            # protection across workers needs); the audit log stays the
            # source for a machine crash, reloaded by preload at start.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            # Workers take turns on this lock, which wakes a waiter at once;
            # SQLite's own busy handler would sleep 1-100 ms per retry.
            self._turn = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise StateUnavailable(f"replay window {path}: {err}") from err
        except sqlite3.Error as err:
            raise StateUnavailable(f"replay window {path}: {err}") from err

    @property
    def window_seconds(self) -> float:
        return self._window

    @property
    def max_entries(self) -> int:
        return self._max

    async def first_seen(self, peer_id: str, request_id: str) -> bool:
        try:
            return await asyncio.to_thread(self.sight, peer_id, request_id)
        except sqlite3.Error as err:
            raise StateUnavailable(f"replay window {self._path}: {err}") from err

    def sight(self, peer_id: str, request_id: str) -> bool:
        """Record the pair now; False if it was seen within the window (blocking)."""
        now_ms = int(time.time() * 1000)
        cutoff_ms = now_ms - int(self._window * 1000)
        with self._lock:
            self._sightings += 1
            fcntl.flock(self._turn, fcntl.LOCK_EX)
            try:
                row = self._db.execute(_SIGHT, (peer_id, request_id, now_ms, cutoff_ms)).fetchone()
                if self._sightings % _EXPIRE_EVERY == 0:
                    self._db.execute(
                        "DELETE FROM replay_window WHERE seen_unix_ms <= ?", (cutoff_ms,)
                    )
            finally:
                fcntl.flock(self._turn, fcntl.LOCK_UN)
        return row is not None

    def preload(self, entries: Iterable[tuple[str, str, float]]) -> None:
        """Seed from the audit log: (peer, request id, age in seconds); known ids are kept."""
        now_ms = int(time.time() * 1000)
        rows = [
            (peer, request_id, now_ms - int(age * 1000))
            for peer, request_id, age in entries
            if request_id and age < self._window
        ]
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(
                        "INSERT OR IGNORE INTO replay_window VALUES (?, ?, ?)", rows
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as err:
            raise StateUnavailable(f"replay window {self._path}: {err}") from err

    def close(self) -> None:
        with self._lock:
            self._db.close()
            os.close(self._turn)
