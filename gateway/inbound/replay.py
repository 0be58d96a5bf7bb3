"""Replay protection: a (peer, request id) pair is accepted once within a window."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

DEFAULT_WINDOW_SECONDS = 600.0
DEFAULT_MAX_ENTRIES = 200_000


class ReplayGuard:
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
