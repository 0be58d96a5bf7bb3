"""The hash chain over audit records: pure functions, no storage.

Each stored record carries ``prev_hash`` (the hash of the record before it, or
:data:`GENESIS_HASH` for the first) and ``record_hash``::

    record_hash = sha256(prev_hash_hex || 0x0a || canonical_bytes(record))

``canonical_bytes`` is the compact JSON array of the record's fields in schema
column order (``seq`` first). An array rather than a sorted-key object: it is
just as unambiguous and several times cheaper to build on the writer thread.

Because ``seq`` is part of the canonical bytes, renumbering a record breaks its
hash just as editing any other field does.

The record format has versions, and a record is hashed in the form of the
version that can hold it, so every record ever written keeps its hash:

- version 1: the 15 fields up to ``latency_ms``;
- version 2: then ``trace_id``, only when it is not empty;
- version 3: then ``trace_id`` (even empty), ``on_behalf_of`` and
  ``actor_chain``, only when one of the last two is not empty.

The array's length says which form it is (15, 16 or 18 values), so no two
records of different content share bytes; setting or clearing any field
still changes the array, hence the hash (docs/audit.md, "Record format").
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Iterator, Mapping
from json.encoder import encode_basestring

from gateway.audit.record import AuditRecord
from gateway.audit.store.sqlite_schema import RECORD_COLUMNS

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of the first record in a log."""


def canonical_bytes(rec: AuditRecord) -> bytes:
    """The bytes a record is hashed as: compact JSON array of all fields in column order."""
    return _canonical(rec.to_json_dict())


def record_hash(prev_hash: str, rec: AuditRecord) -> str:
    """The hex SHA-256 of ``rec`` chained onto ``prev_hash``.

    Args:
        prev_hash: Hex hash of the previous record (``GENESIS_HASH`` for the first).
        rec: The record, with its final ``seq``.

    Returns:
        64 lowercase hex characters.
    """
    return fields_hash(prev_hash, rec.to_json_dict())


def fields_hash(prev_hash: str, fields: Mapping[str, object]) -> str:
    """:func:`record_hash` of a record given as ``to_json_dict()`` output.

    Lets the writer and the verifier hash a record under another ``seq``
    without building a new AuditRecord each time.
    """
    return _values_hash(prev_hash, _IN_COLUMN_ORDER(fields))


def chained_row(prev_hash: str, fields: Mapping[str, object]) -> tuple[tuple[object, ...], str]:
    """The row that stores a record (its values in column order, ``prev_hash``, its
    hash) and that hash.

    The same hash as :func:`fields_hash`, with the values taken out of
    ``fields`` once for both the hash and the row (the writer thread does
    this for every record).
    """
    values: tuple[object, ...] = _IN_COLUMN_ORDER(fields)
    digest = _values_hash(prev_hash, values)
    return (*values, prev_hash, digest), digest


def _values_hash(prev_hash: str, values: tuple[object, ...]) -> str:
    digest = hashlib.sha256(prev_hash.encode("utf-8"))
    digest.update(b"\n")
    digest.update(_canonical_values(values))
    return digest.hexdigest()


def _canonical(fields: Mapping[str, object]) -> bytes:
    return _canonical_values(_IN_COLUMN_ORDER(fields))


def _canonical_values(values: tuple[object, ...]) -> bytes:
    if values[-1] == "" and values[-2] == "":  # no user: the version-2 form
        values = values[:-2]
        if values[-1] == "":  # trace_id: absent from version-1 hashes
            values = values[:-1]
    return _encode(values).encode("utf-8")


_IN_COLUMN_ORDER = operator.itemgetter(*RECORD_COLUMNS)

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""The canonical encoder: its output for a flat array is the chain's format, for good."""


def _one_shot_encoder() -> Callable[[tuple[object, ...]], str]:
    """``_ENCODER.encode`` for a flat array, without building the C encoder per call.

    ``JSONEncoder.encode`` makes a new C encoder from ``_ENCODER``'s settings
    on every call; this makes the very same one once (the same bytes, the
    same errors for a value JSON cannot hold), minus the circular-reference
    bookkeeping a flat array of scalars never needs.
    """
    try:
        from _json import make_encoder
    except ImportError:  # a Python without the C accelerator
        return _ENCODER.encode
    iterencode: Callable[[object, int], Iterator[str]] = make_encoder(
        None,  # markers: no circular-reference check
        _ENCODER.default,
        encode_basestring,  # ensure_ascii=False
        None,  # indent
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        _ENCODER.sort_keys,
        _ENCODER.skipkeys,
        _ENCODER.allow_nan,
    )

    def encode(values: tuple[object, ...]) -> str:
        return "".join(iterencode(values, 0))

    return encode


_encode = _one_shot_encoder()
