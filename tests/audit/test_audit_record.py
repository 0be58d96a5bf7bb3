"""AuditRecord, the hash chain functions, and the package's public surface."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import pytest

import gateway.audit
from gateway.audit import AuditRecord
from gateway.audit.chain import GENESIS_HASH, canonical_bytes, record_hash
from gateway.audit.record import checked_fields
from gateway.audit.store.sqlite_schema import RECORD_COLUMNS

RecordFactory = Callable[..., AuditRecord]


def test_record_has_no_payload_content_field() -> None:
    names = {field.name for field in dataclasses.fields(AuditRecord)}
    assert "payload" not in names
    assert {name for name in names if "payload" in name} == {"payload_size", "payload_sha256"}


def test_to_json_dict_has_every_field(make_record: RecordFactory) -> None:
    rec = make_record(task_id="t-1", step_id="s-1", detail="capability not registered", seq=7)
    data = rec.to_json_dict()
    assert data == {field.name: getattr(rec, field.name) for field in dataclasses.fields(rec)}


def test_canonical_bytes_are_a_compact_json_array_in_column_order(
    make_record: RecordFactory,
) -> None:
    # With a user, every column is in the array (the version-3 form).
    rec = make_record(seq=3, trace_id="ab" * 16, on_behalf_of="u", actor_chain='["a"]')
    raw = canonical_bytes(rec)
    values = json.loads(raw)
    assert values == [rec.to_json_dict()[name] for name in RECORD_COLUMNS]
    assert values[0] == 3  # seq first
    assert raw == json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    ("detail", "latency"),
    [
        ("", 0.25),
        ('quote " backslash \\ nul \x00 del \x7f', 1e-07),
        ("bidi \u202e and \u00e4\u00f6 and \U0001f600", 5e-05),
        ("\n\t\r\x1f", 123456.789),
    ],
)
def test_canonical_bytes_are_the_encoders_bytes_for_any_text_and_latency(
    make_record: RecordFactory, detail: str, latency: float
) -> None:
    # The chain's format is JSONEncoder(separators, ensure_ascii=False,
    # allow_nan=False).encode(array) encoded as UTF-8, whatever builds it.
    rec = make_record(
        seq=9, detail=detail, latency_ms=latency, trace_id="cd" * 16, on_behalf_of=detail or "u"
    )
    values = [checked_fields(rec)[name] for name in RECORD_COLUMNS]
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert canonical_bytes(rec) == encoder.encode(values).encode("utf-8")


def test_values_json_cannot_hold_are_refused_as_the_encoder_refuses_them(
    make_record: RecordFactory,
) -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        canonical_bytes(make_record(latency_ms=math.nan))
    with pytest.raises(TypeError, match="bytes is not JSON serializable"):
        canonical_bytes(make_record(detail=b"raw"))
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate is not UTF-8
        canonical_bytes(make_record(detail="\ud800"))


def test_an_empty_trace_id_hashes_as_records_before_it_existed(
    make_record: RecordFactory,
) -> None:
    # Schema version 1 had no trace_id: its records must keep their hashes.
    rec = make_record(seq=3)
    values = json.loads(canonical_bytes(rec))
    assert values == [rec.to_json_dict()[name] for name in RECORD_COLUMNS[:-3]]
    assert canonical_bytes(dataclasses.replace(rec, trace_id="00" * 16)) != canonical_bytes(rec)


def test_empty_user_columns_hash_as_records_before_they_existed(
    make_record: RecordFactory,
) -> None:
    # Schema version 2 had no on_behalf_of and actor_chain: its records keep their hashes.
    rec = make_record(seq=3, trace_id="ab" * 16)
    values = json.loads(canonical_bytes(rec))
    assert values == [rec.to_json_dict()[name] for name in RECORD_COLUMNS[:-2]]
    for user in ({"on_behalf_of": "u"}, {"actor_chain": '["a"]'}):
        assert canonical_bytes(dataclasses.replace(rec, **user)) != canonical_bytes(rec)


def test_record_hash_depends_on_prev_hash_seq_and_fields(make_record: RecordFactory) -> None:
    rec = make_record(seq=1)
    base = record_hash(GENESIS_HASH, rec)
    assert len(base) == 64
    assert base == record_hash(GENESIS_HASH, rec)
    assert base != record_hash("1" * 64, rec)
    assert base != record_hash(GENESIS_HASH, dataclasses.replace(rec, seq=2))
    assert base != record_hash(GENESIS_HASH, dataclasses.replace(rec, reason="X"))


def test_checked_fields_coerce_to_declared_types(make_record: RecordFactory) -> None:
    rec = make_record(latency_ms=3, time_unix_ms=1.7e12)

    values = checked_fields(rec)

    assert isinstance(values["latency_ms"], float)
    assert values["time_unix_ms"] == 1_700_000_000_000
    assert isinstance(values["time_unix_ms"], int)
    assert values == {**rec.to_json_dict(), "latency_ms": 3.0, "time_unix_ms": 1_700_000_000_000}


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"decision": "deny"}, ValueError),
        ({"latency_ms": math.nan}, ValueError),
        ({"payload_size": 1.5}, ValueError),
        ({"payload_size": "12"}, TypeError),
        ({"peer_id": None}, TypeError),
        ({"latency_ms": "1.5"}, TypeError),
        ({"payload_size": True}, TypeError),
        ({"request_id": b"bytes"}, TypeError),
    ],
)
def test_checked_fields_reject_malformed_records(
    make_record: RecordFactory, overrides: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        checked_fields(make_record(**overrides))


def test_public_surface() -> None:
    assert sorted(gateway.audit.__all__) == [
        "AuditLog",
        "AuditRecord",
        "ChainProblem",
        "CheckpointReport",
        "Decision",
        "VerifyReport",
        "format_json_lines",
        "format_table",
        "parse_since",
        "query_records",
        "verify_chain",
        "verify_checkpoints",
    ]
    for name in gateway.audit.__all__:
        assert hasattr(gateway.audit, name)
