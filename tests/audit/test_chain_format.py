"""The chain's bytes and hashes, pinned: a log written today verifies for good.

The canonical bytes of a record are the chain's format (``gateway.audit.chain``):
a change to how they are built, however faithful it looks, must give these
very bytes and hashes, and accept or refuse odd field values exactly as here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.audit import AuditRecord
from gateway.audit.chain import GENESIS_HASH, canonical_bytes, chained_row, record_hash
from gateway.audit.record import checked_fields

BASE: dict[str, Any] = {
    "time_unix_ms": 1_767_225_600_123,
    "request_id": "req-1",
    "peer_id": "spiffe://example.org/agent/alice",
    "capability": "text.echo",
    "version_constraint": "^1.0",
    "served_version": "1.0.0",
    "decision": "allow",
    "reason": "OK",
    "payload_size": 256,
    "payload_sha256": "ab" * 32,
    "latency_ms": 0.25,
}
CHAIN: list[tuple[dict[str, Any], str]] = [
    ({}, "d9ff46c60df1a3de4b79906882e55025db9ea41a83b52d743bd34041ee54d995"),
    (
        {"decision": "refuse", "reason": "CAPABILITY_NOT_GRANTED", "served_version": ""},
        "8ff8be8230d71eec07e7491e8725f8b1a81af85fb6f531ac1a6e416fad156a9c",
    ),
    (
        {"detail": 'quote " backslash \\ nul \x00 del \x7f', "latency_ms": 1e-07},
        "75809a508e50ecb0198e8a05ce599f41089ec2de4034b2ccf629b95a6846ddba",
    ),
    (
        {"detail": "bidi \u202e \u00e4\u00f6 \U0001f600", "trace_id": "cd" * 16, "seq": 7},
        "60296c28017b4825d249a2375b6fc4a0374f717551b1fdf3bd4f2531f51999ec",
    ),
    (
        {"peer_id": "", "task_id": "task-9", "step_id": "step-2", "latency_ms": 123456.789},
        "5449c61fcfd5cd80aeb4812f737a408cfeb55de2ab8d7ceab98eb89607dcca23",
    ),
    (
        {"time_unix_ms": 2**62, "payload_size": 0, "seq": 2**40},
        "b1e3ea47af340d7bf4e3cf42361494378e48445c8eaa2f44a1875d726025ccd6",
    ),
]
"""Records the gateway writes, chained from genesis in this order, with each one's hash."""


def record(**change: Any) -> AuditRecord:
    return AuditRecord(**{**BASE, **change})


def test_canonical_bytes_are_pinned() -> None:
    sha = "ab" * 32
    assert (
        canonical_bytes(record())
        == (
            '[0,1767225600123,"req-1","","","spiffe://example.org/agent/alice","text.echo",'
            f'"^1.0","1.0.0","allow","OK","",256,"{sha}",0.25]'
        ).encode()
    )
    escaped = record(detail='quote " backslash \\ nul \x00 del \x7f', latency_ms=1e-07)
    assert canonical_bytes(escaped).endswith(
        b'"quote \\" backslash \\\\ nul \\u0000 del \x7f",256,"' + sha.encode() + b'",1e-07]'
    )
    traced = record(detail="bidi \u202e \u00e4\u00f6 \U0001f600", trace_id="cd" * 16, seq=7)
    assert canonical_bytes(traced).startswith(b"[7,")
    assert canonical_bytes(traced).endswith(
        '"bidi \u202e \u00e4\u00f6 \U0001f600",256,"{}",0.25,"{}"]'.format(sha, "cd" * 16).encode()
    )


def test_chained_hashes_are_pinned() -> None:
    prev = GENESIS_HASH
    for change, expected in CHAIN:
        rec = record(**change)
        row, digest = chained_row(prev, checked_fields(rec))
        assert digest == expected == record_hash(prev, rec), change
        assert row[-2:] == (prev, expected)
        prev = digest


@pytest.mark.parametrize(
    ("change", "checked"),
    [
        ({"latency_ms": 2}, {"latency_ms": 2.0}),
        ({"payload_size": 3.0}, {"payload_size": 3}),
        ({"seq": -1}, {"seq": -1}),
        ({"detail": "\ud800"}, {"detail": "\ud800"}),
    ],
)
def test_odd_values_kept_or_coerced(change: dict[str, Any], checked: dict[str, Any]) -> None:
    values = checked_fields(record(**change))
    assert {name: values[name] for name in change} == checked
    assert {name: type(values[name]) for name in change} == {
        name: type(value) for name, value in checked.items()
    }


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"payload_size": 3.5}, ValueError, "payload_size must be a whole number, not 3.5"),
        ({"payload_size": True}, TypeError, "payload_size must be a number, not bool"),
        ({"latency_ms": True}, TypeError, "latency_ms must be a number, not bool"),
        ({"latency_ms": math.nan}, ValueError, "latency_ms must be finite, not nan"),
        ({"latency_ms": math.inf}, ValueError, "latency_ms must be finite, not inf"),
        ({"latency_ms": "1"}, TypeError, "latency_ms must be a number, not str"),
        ({"detail": b"raw"}, TypeError, "detail must be str, not bytes"),
        ({"decision": "maybe"}, ValueError, "decision must be 'allow' or 'refuse', not 'maybe'"),
    ],
)
def test_odd_values_refused(change: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as refused:
        checked_fields(record(**change))
    assert str(refused.value) == message


def test_a_lone_surrogate_passes_the_checks_but_never_reaches_the_chain() -> None:
    with pytest.raises(UnicodeEncodeError):
        canonical_bytes(record(detail="\ud800"))


def test_a_record_with_a_user_is_hashed_in_the_version_3_form() -> None:
    # Version 3 appends trace_id (even empty), on_behalf_of and actor_chain, and
    # only when a user is there: every record above keeps its version-1/2 bytes.
    sha = "ab" * 32
    actors = '["spiffe://example.org/agent/bob"]'
    rec = record(on_behalf_of="user-42", actor_chain=actors, seq=8)
    assert (
        canonical_bytes(rec)
        == (
            '[8,1767225600123,"req-1","","","spiffe://example.org/agent/alice","text.echo",'
            f'"^1.0","1.0.0","allow","OK","",256,"{sha}",0.25,"","user-42",'
            '"[\\"spiffe://example.org/agent/bob\\"]"]'
        ).encode()
    )
    assert (
        record_hash(GENESIS_HASH, rec)
        == "917bf33b91ca72beabc5dc13736bb48935f0ee271b582db8e398c700e658c0ff"
    )
    # Clearing the user, or only its actor chain, changes the hash.
    assert record_hash(GENESIS_HASH, record(seq=8)) != record_hash(GENESIS_HASH, rec)
    assert record_hash(GENESIS_HASH, record(on_behalf_of="user-42", seq=8)) != record_hash(
        GENESIS_HASH, rec
    )
