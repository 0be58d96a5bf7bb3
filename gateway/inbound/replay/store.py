"""Replay protection: a (peer, request id) pair is accepted once within a window.

``ReplayWindow`` is the interface, and its backends open what they hold when
constructed and release it in ``close``: ``ReplayTable``
(:mod:`gateway.inbound.replay.mmap`) keeps the window in a fixed-size table,
in memory (one process) or in a memory-mapped file the worker processes of one
agent share, reloaded from the audit log at start; a full table refuses new ids
rather than forgetting live ones. ``PostgresReplayWindow``
(:mod:`gateway.inbound.replay.postgres`) keeps it in a table every replica of
the agent shares.

There is no SQLite window, and so no SQL shared between backends: the window
is checked on every call, so with SQLite state it is a table in memory (a
sighting takes microseconds on the event loop: no commit, no thread hop), and
the audit log it is reloaded from at start is what outlives the process. Only
replicas on other hosts need a database, and there a sighting is one statement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

DEFAULT_WINDOW_SECONDS = 600.0
DEFAULT_MAX_ENTRIES = 200_000


class ReplayWindow(ABC):
    """Where the request ids seen recently are kept."""

    shared = False
    """True if other replicas see the same window (then nothing is reloaded at start)."""

    @property
    @abstractmethod
    def window_seconds(self) -> float:
        """How long a request id is remembered."""

    @property
    @abstractmethod
    def max_entries(self) -> int:
        """Most request ids remembered at once (a bound for reloading)."""

    @abstractmethod
    async def first_seen(self, peer_id: str, request_id: str) -> bool:
        """Record the pair; False if it was already seen within the window.

        Raises:
            StateUnavailable: a shared window cannot be read or written.
        """

    def preload(self, entries: Iterable[tuple[str, str, float]]) -> None:
        """Seed from history: (peer, request id, age in seconds); a shared window ignores it."""
        del entries  # nothing to seed: the shared table outlives processes

    @abstractmethod
    def close(self) -> None:
        """Release what the window holds (the table's memory or file, the pool)."""
