"""The replay window in PostgreSQL, shared by every replica of one agent id.

One row per (agent, peer, request id). A sighting is one statement: insert
the row, or take over a row older than the window; if neither happened the
id was used within the window, on whichever replica. Old rows are deleted
now and then by the sighting itself (no background job to forget).
"""

from __future__ import annotations

import asyncio
import time

from gateway.inbound.replay.store import DEFAULT_MAX_ENTRIES, DEFAULT_WINDOW_SECONDS, ReplayWindow
from gateway.postgres.pool import Connection, StatePool

_SIGHT = (
    "INSERT INTO replay_window VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (agent_id, peer, request_id) DO UPDATE SET seen_unix_ms = excluded.seen_unix_ms "
    "WHERE replay_window.seen_unix_ms <= %s RETURNING 1"
)
_EXPIRE_EVERY = 1000
"""Sightings between two deletions of expired rows."""


class PostgresReplayWindow(ReplayWindow):
    """``ReplayWindow`` in the shared ``replay_window`` table."""

    shared = True

    def __init__(
        self,
        pool: StatePool,
        agent_id: str,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._pool = pool
        self._agent_id = agent_id
        self._window = window_seconds
        self._max = max_entries
        self._sightings = 0

    @property
    def window_seconds(self) -> float:
        return self._window

    @property
    def max_entries(self) -> int:
        return self._max

    async def first_seen(self, peer_id: str, request_id: str) -> bool:
        now_ms = int(time.time() * 1000)
        cutoff_ms = now_ms - int(self._window * 1000)
        self._sightings += 1
        expire = self._sightings % _EXPIRE_EVERY == 0

        def work(conn: Connection) -> bool:
            row = conn.execute(
                _SIGHT, (self._agent_id, peer_id, request_id, now_ms, cutoff_ms)
            ).fetchone()
            if expire:
                conn.execute(
                    "DELETE FROM replay_window WHERE agent_id = %s AND seen_unix_ms <= %s",
                    (self._agent_id, cutoff_ms),
                )
            return row is not None

        return await asyncio.to_thread(self._pool.run, work)

    def close(self) -> None:
        self._pool.close()
