"""Token bucket, per-peer and server-wide limits, exact counts with a fake clock."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.errors import ConcurrencyLimited, RateLimited, ServerBusy
from gateway.inbound.limits.admission import PeerCallLimits, TokenBucket
from policies.grants import PolicyDocument
from policies.policy_file import Policy, load_policy, render_policy
from tests.helpers.limits import FakeClock, peer_grant


def test_a_burst_of_five_allows_exactly_five_then_refills_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, size=5, clock=clock)
    outcomes = [bucket.take() for _ in range(12)]
    assert outcomes.count(True) == 5 and outcomes[:5] == [True] * 5
    clock.now += 0.5  # one token at 2 per second
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now += 60  # never more than the bucket holds
    assert [bucket.take() for _ in range(7)].count(True) == 5


def test_rate_limit_counts_refusals_per_peer() -> None:
    clock = FakeClock()
    limits = PeerCallLimits(256, clock=clock)
    grant = peer_grant(max_calls_per_second=1.0, burst=5)
    slots, refused = [], 0
    for _ in range(12):
        try:
            slots.append(limits.acquire(grant.peer, grant))
        except RateLimited:
            refused += 1
    assert (len(slots), refused) == (5, 7)
    stats = limits.stats()
    assert dict(stats.rate_limited) == {grant.peer: 7}
    assert stats.in_flight_total == 5 and stats.refused_total == 7
    for slot in slots:
        slot.release()
        slot.release()  # twice is harmless
    assert limits.stats().in_flight_total == 0


def test_in_flight_limit_and_server_cap() -> None:
    limits = PeerCallLimits(3)
    bob = peer_grant(max_in_flight=2)
    carol = peer_grant(peer="spiffe://example.org/agent/carol")
    first, _second = limits.acquire(bob.peer, bob), limits.acquire(bob.peer, bob)
    with pytest.raises(ConcurrencyLimited):
        limits.acquire(bob.peer, bob)
    limits.acquire(carol.peer, carol)
    with pytest.raises(ServerBusy):
        limits.acquire(carol.peer, carol)
    first.release()
    limits.acquire(carol.peer, carol)  # the freed place is the server's again
    stats = limits.stats()
    assert dict(stats.concurrency_limited) == {bob.peer: 1}
    assert dict(stats.server_busy) == {carol.peer: 1}
    assert dict(stats.in_flight) == {bob.peer: 1, carol.peer: 2}


def test_a_changed_grant_rate_applies_at_once() -> None:
    clock = FakeClock()
    limits = PeerCallLimits(256, clock=clock)
    tight = peer_grant(max_calls_per_second=1.0, burst=1)
    limits.acquire(tight.peer, tight)
    with pytest.raises(RateLimited):
        limits.acquire(tight.peer, tight)
    looser = peer_grant(max_calls_per_second=1.0, burst=3)
    assert [limits.acquire(looser.peer, looser) for _ in range(3)]


def test_burst_needs_a_rate_and_limits_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="burst needs max_calls_per_second"):
        peer_grant(burst=5)
    for bad in ({"max_calls_per_second": 0}, {"max_in_flight": 0}, {"burst": 0}):
        with pytest.raises(ValidationError):
            peer_grant(max_calls_per_second=1.0, **bad) if "burst" in bad else peer_grant(**bad)
    assert peer_grant(max_calls_per_second=2.5).bucket_size == 3


def test_limits_survive_the_policy_file_round_trip(tmp_path: Any) -> None:
    grant = peer_grant(max_calls_per_second=0.5, burst=4, max_in_flight=2)
    path = tmp_path / "policy.toml"
    path.write_text(render_policy(PolicyDocument(grants=(grant,))))
    loaded: Policy = load_policy(path)
    assert loaded.grants[grant.peer] == grant


def test_make_room_checks_a_slot_taken_as_a_poll_against_the_peers_other_calls() -> None:
    limits = PeerCallLimits(max_concurrent_calls=10)
    one = peer_grant(max_in_flight=1)
    poll = peer_grant()  # how the HTTP edge takes a JSON-RPC request's slot
    alone = limits.acquire("spiffe://example.org/agent/bob", poll)
    limits.make_room(alone, one)  # no other call: it fits, and keeps its one place
    assert limits.stats().in_flight_total == 1
    second = limits.acquire("spiffe://example.org/agent/bob", poll)
    with pytest.raises(ConcurrencyLimited, match="1 calls already running; limit 1"):
        limits.make_room(second, one)
    assert dict(limits.stats().concurrency_limited) == {"spiffe://example.org/agent/bob": 1}
    assert limits.stats().in_flight_total == 2  # the refused slot is still its holder's
    second.release()
    alone.release()
    assert limits.stats().in_flight_total == 0
