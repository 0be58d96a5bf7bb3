"""Per-peer rate and concurrency limits, and the server-wide cap on calls.

Checked in the decision pipeline right after the peer's grant is known and
before anything of the payload is parsed (see ``gateway.inbound.pipeline``);
on the HTTP bindings by the edge, before the body is read, the pipeline then
adopting that slot (``EdgeSlot``) so a request takes one token.
A call that passes holds one in-flight slot for its peer and one of the
server's; :class:`CallSlot` gives both back when the call ends, however it ends.

:class:`AdmissionControl` is what the pipeline asks. :class:`PeerCallLimits` keeps
everything in this process (one process: ``workers = 1``); with workers,
``gateway.inbound.limits.shared_table.LimitTable`` keeps buckets and in-flight counts in
a file the workers share, so a grant holds across all of them.

Everything here runs on the event loop thread: no locks, no awaits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from gateway.errors import ConcurrencyLimited, RateLimited, ServerBusy
from policies.grants import PeerGrant

Clock = Callable[[], float]
"""Seconds from a monotonic origin (``time.monotonic`` unless a test injects one)."""


class TokenBucket:
    """``size`` tokens, refilled at ``rate`` per second; a call takes one.

    Args:
        rate: Tokens added per second.
        size: Most tokens the bucket holds (the burst); it starts full.
        clock: Monotonic seconds; injected by tests for exact counts.
    """

    def __init__(self, rate: float, size: int, clock: Clock = time.monotonic) -> None:
        self.rate = rate
        self.size = size
        self._clock = clock
        self._tokens = float(size)
        self._last = clock()

    def take(self) -> bool:
        """Take one token; False (and nothing taken) when the bucket is empty."""
        now = self._clock()
        self._tokens = min(self.size, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


@dataclass(frozen=True, slots=True)
class LimitStats:
    """A read-only snapshot of limit refusals and calls in flight.

    Attributes:
        rate_limited: ``RATE_LIMITED`` refusals per peer since start.
        concurrency_limited: ``CONCURRENCY_LIMITED`` refusals per peer.
        server_busy: ``SERVER_BUSY`` refusals per peer.
        in_flight: Admitted calls running now, per peer.
        in_flight_total: Admitted calls running now, all peers.
        max_concurrent_calls: The server-wide cap.
    """

    rate_limited: Mapping[str, int]
    concurrency_limited: Mapping[str, int]
    server_busy: Mapping[str, int]
    in_flight: Mapping[str, int]
    in_flight_total: int
    max_concurrent_calls: int

    @property
    def refused_total(self) -> int:
        """Every limit refusal, all peers and reasons."""
        return sum(
            sum(table.values())
            for table in (self.rate_limited, self.concurrency_limited, self.server_busy)
        )


def limit_refusal_counts(stats: LimitStats, *, by_peer: bool) -> list[tuple[dict[str, str], int]]:
    """Limit refusals as (labels, count) for a metrics reading, peers only if asked.

    Peer ids as labels are opt-in (``[metrics] peer_labels``): their number is
    the number of granted peers, which can be large.
    """
    readings: list[tuple[dict[str, str], int]] = []
    for reason, table in (
        ("RATE_LIMITED", stats.rate_limited),
        ("CONCURRENCY_LIMITED", stats.concurrency_limited),
        ("SERVER_BUSY", stats.server_busy),
    ):
        if by_peer:
            readings.extend(({"reason": reason, "peer": peer}, n) for peer, n in table.items())
        else:
            readings.append(({"reason": reason}, sum(table.values())))
    return readings


class AdmissionControl(Protocol):
    """Admits calls under per-peer limits and the server-wide cap (what the pipeline asks)."""

    max_concurrent_calls: int

    def acquire(self, peer_id: str, grant: PeerGrant) -> CallSlot:
        """Admit one call of ``peer_id`` under ``grant``, or raise the limit it hit.

        Raises:
            RateLimited: the peer's bucket is empty.
            ConcurrencyLimited: the peer has ``max_in_flight`` calls running.
            ServerBusy: the agent runs ``max_concurrent_calls`` calls.
            StateUnavailable: shared limits cannot be read or written (nothing admitted).
        """
        ...

    def make_room(self, slot: CallSlot, grant: PeerGrant) -> None:
        """Require room under ``grant.max_in_flight`` for the call ``slot`` already counts.

        For a slot taken as a poll before the call's kind was known (the HTTP
        edge, JSON-RPC): the call is within the cap if the peer's other calls
        leave it room. The slot keeps its places either way (its holder
        releases it).

        Raises:
            ConcurrencyLimited: the peer's other calls fill ``max_in_flight``.
            StateUnavailable: shared limits cannot be read.
        """
        ...

    def release(self, peer_id: str) -> None:
        """One call of ``peer_id`` ended (use :meth:`CallSlot.release`)."""
        ...

    def stats(self) -> LimitStats:
        """A snapshot of refusals per peer and reason, and calls in flight."""
        ...


class RefusalCounts:
    """Limit refusals per reason and peer, counted in this process."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[str, int]] = {
            RateLimited.reason: {},
            ConcurrencyLimited.reason: {},
            ServerBusy.reason: {},
        }

    def count(self, reason: str, peer_id: str) -> None:
        """One more refusal of ``peer_id`` for ``reason``."""
        table = self._tables[reason]
        table[peer_id] = table.get(peer_id, 0) + 1

    def stats(
        self, in_flight: Mapping[str, int], in_flight_total: int, max_concurrent_calls: int
    ) -> LimitStats:
        """A snapshot of the counts, with the in-flight figures given."""
        return LimitStats(
            rate_limited=MappingProxyType(dict(self._tables[RateLimited.reason])),
            concurrency_limited=MappingProxyType(dict(self._tables[ConcurrencyLimited.reason])),
            server_busy=MappingProxyType(dict(self._tables[ServerBusy.reason])),
            in_flight=MappingProxyType(dict(in_flight)),
            in_flight_total=in_flight_total,
            max_concurrent_calls=max_concurrent_calls,
        )


@dataclass(slots=True)
class CallSlot:
    """One admitted call's place in its peer's and the server's in-flight counts."""

    limits: AdmissionControl
    peer_id: str
    released: bool = field(default=False)

    def release(self) -> None:
        """Give the places back; safe to call more than once."""
        if not self.released:
            self.released = True
            self.limits.release(self.peer_id)


class PeerCallLimits:
    """Per-peer token buckets and in-flight counts, and the server-wide cap.

    Buckets are kept per peer and rebuilt when the peer's grant changes its
    rate or burst (a policy reload), so a new limit applies at once. Only
    peers with a grant ever get here, so the tables are bounded by the policy.
    """

    def __init__(self, max_concurrent_calls: int, clock: Clock = time.monotonic) -> None:
        self.max_concurrent_calls = max_concurrent_calls
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._in_flight: dict[str, int] = {}
        self._total = 0
        self._refused = RefusalCounts()

    def acquire(self, peer_id: str, grant: PeerGrant) -> CallSlot:
        """Admit one call of ``peer_id`` under ``grant``, or raise the limit it hit.

        Order: the peer's rate, its in-flight cap, then the server's cap, so a
        peer over its own limits never takes the server's capacity.

        Raises:
            RateLimited: the peer's bucket is empty.
            ConcurrencyLimited: the peer has ``max_in_flight`` calls running.
            ServerBusy: the agent runs ``max_concurrent_calls`` calls.
        """
        if grant.max_calls_per_second is not None and not self._bucket(peer_id, grant).take():
            self._refused.count(RateLimited.reason, peer_id)
            raise RateLimited(f"over {grant.max_calls_per_second:g} calls per second")
        running = self._in_flight.get(peer_id, 0)
        if grant.max_in_flight is not None and running >= grant.max_in_flight:
            self._refused.count(ConcurrencyLimited.reason, peer_id)
            raise ConcurrencyLimited(
                f"{running} calls already running; limit {grant.max_in_flight}"
            )
        if self._total >= self.max_concurrent_calls:
            self._refused.count(ServerBusy.reason, peer_id)
            raise ServerBusy("the agent is running as many calls as it accepts; retry later")
        self._in_flight[peer_id] = running + 1
        self._total += 1
        return CallSlot(self, peer_id)

    def make_room(self, slot: CallSlot, grant: PeerGrant) -> None:
        """Require room under ``grant.max_in_flight`` for the call ``slot`` already counts.

        Raises:
            ConcurrencyLimited: the peer's other calls fill ``max_in_flight``.
        """
        others = self._in_flight.get(slot.peer_id, 0) - 1
        if grant.max_in_flight is not None and others >= grant.max_in_flight:
            self._refused.count(ConcurrencyLimited.reason, slot.peer_id)
            raise ConcurrencyLimited(f"{others} calls already running; limit {grant.max_in_flight}")

    def release(self, peer_id: str) -> None:
        """One call of ``peer_id`` ended (use :meth:`CallSlot.release`)."""
        left = self._in_flight.get(peer_id, 0) - 1
        if left > 0:
            self._in_flight[peer_id] = left
        else:
            self._in_flight.pop(peer_id, None)
        self._total = max(0, self._total - 1)

    def stats(self) -> LimitStats:
        """A snapshot of refusals per peer and reason, and calls in flight."""
        return self._refused.stats(self._in_flight, self._total, self.max_concurrent_calls)

    def _bucket(self, peer_id: str, grant: PeerGrant) -> TokenBucket:
        rate, size = grant.max_calls_per_second or 0.0, grant.bucket_size
        bucket = self._buckets.get(peer_id)
        if bucket is None or bucket.rate != rate or bucket.size != size:
            bucket = TokenBucket(rate, size, self._clock)
            self._buckets[peer_id] = bucket
        return bucket
