"""Replay protection: a (peer, request id) pair is accepted once within a window.

``ReplayWindow`` is the interface; ``ReplayGuard`` keeps the window in memory
(one process, reloaded from the audit log at start), ``SharedReplayWindow``
(:mod:`gateway.inbound.shared_replay`) in a memory-mapped file the worker
processes of one agent share, ``PostgresReplayWindow``
(:mod:`gateway.inbound.pg_replay`) in a table every replica of the agent shares.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
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

    def close(self) -> None:
        """Release what the window holds."""
        return None  # the in-memory window holds nothing to release


class ReplayGuard(ReplayWindow):
    """Remembers recent request ids per peer, bounded in time and memory.

    Only calls that passed the policy are remembered, so unknown peers cannot
    fill the table and push out the ids of granted ones.
    """

    def __init__(
        self,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._window = window_seconds
        self._max = max_entries
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def first_sighting(self, peer_id: str, request_id: str) -> bool:
        """Record the pair; False if it was already seen within the window."""
        now = time.monotonic()
        key = (peer_id, request_id)
        stamp = self._seen.get(key)
        if stamp is not None and now - stamp < self._window:
            return False
        self._seen[key] = now
        self._seen.move_to_end(key)
        self._expire(now)
        return True

    async def first_seen(self, peer_id: str, request_id: str) -> bool:
        return self.first_sighting(peer_id, request_id)

    @property
    def window_seconds(self) -> float:
        """How long a request id is remembered."""
        return self._window

    @property
    def max_entries(self) -> int:
        """Most request ids remembered at once."""
        return self._max

    def preload(self, entries: Iterable[tuple[str, str, float]]) -> None:
        """Seed from history: (peer, request id, age in seconds) of earlier calls."""
        now = time.monotonic()
        for peer_id, request_id, age in sorted(entries, key=lambda entry: -entry[2]):
            if request_id and age < self._window:
                self._seen[(peer_id, request_id)] = now - age
        self._expire(now)

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: float) -> None:
        seen = self._seen
        while seen:
            _, stamp = next(iter(seen.items()))
            if now - stamp < self._window and len(seen) <= self._max:
                break
            seen.popitem(last=False)
