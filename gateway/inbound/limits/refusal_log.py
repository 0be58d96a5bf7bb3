"""How limit refusals reach the audit log: one durable record, then counts.

A peer over its rate can send thousands of calls a second. One durable
(fsynced) record each would let it fill the disk and queue every other peer's
records behind its own. So, per ``(peer, reason)`` and interval (1 s by
default):

- the first refusal is written durably, like any refusal (detail ``count=1``);
  only this caller waits for the commit;
- the next ones are only counted in memory; their callers are answered at once;
- when the interval is over (or the agent stops), one record carries the
  count: reason as refused, capability ``""``, detail
  ``count=N window_ms=W`` (N refusals in the W ms before the record's time).

Summing ``count=`` over the records (``a2a-gateway audit --summary``) gives
exactly how many calls each peer had refused, per reason, and the records'
times say when, to the interval. Rows grow with intervals, not with calls.
Keys are authenticated peers that hold a grant (limits are checked after the
grant is known), so memory is bounded by the policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from gateway.audit import AuditLog, AuditRecord
from gateway.audit.summary import limit_count_detail
from gateway.inbound.limits.admission import Clock

DEFAULT_INTERVAL_SECONDS = 1.0


@dataclass(slots=True)
class _Window:
    opened: float
    counted: int = 0


class LimitRefusalLog:
    """Aggregates limit refusals into O(intervals) audit records (see the module doc).

    Args:
        audit: The agent's audit log.
        interval: Seconds one aggregation window lasts.
        clock: Monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        audit: AuditLog,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        clock: Clock = time.monotonic,
    ) -> None:
        self._audit = audit
        self._interval = interval
        self._clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}

    async def record(self, refusal: AuditRecord) -> None:
        """Record one limit refusal; only the first of its window waits for a commit."""
        key = (refusal.peer_id, refusal.reason)
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.opened < self._interval:
            window.counted += 1
            return
        if window is not None:
            self._write_count(key, window, now)
        # Opened before the await: refusals arriving during the commit are counted.
        self._windows[key] = _Window(opened=now)
        await self._audit.record_durable(replace(refusal, detail=limit_count_detail(1)))

    def flush_expired(self) -> None:
        """Write the count of every window whose interval is over (called periodically)."""
        now = self._clock()
        for key, window in list(self._windows.items()):
            if now - window.opened >= self._interval:
                self._write_count(key, window, now)
                del self._windows[key]

    def flush_all(self) -> None:
        """Write every pending count (at shutdown, before the audit log closes)."""
        now = self._clock()
        for key, window in list(self._windows.items()):
            self._write_count(key, window, now)
        self._windows.clear()

    def pending(self) -> int:
        """Refusals counted but not yet written."""
        return sum(window.counted for window in self._windows.values())

    def _write_count(self, key: tuple[str, str], window: _Window, now: float) -> None:
        if window.counted == 0:
            return
        peer_id, reason = key
        window_ms = max(0, round((now - window.opened) * 1000))
        self._audit.record(
            AuditRecord(
                time_unix_ms=int(time.time() * 1000),
                request_id="",
                peer_id=peer_id,
                capability="",
                version_constraint="",
                served_version="",
                decision="refuse",
                reason=reason,
                payload_size=0,
                payload_sha256="",
                latency_ms=0.0,
                detail=limit_count_detail(window.counted, window_ms),
            )
        )
        window.counted = 0
