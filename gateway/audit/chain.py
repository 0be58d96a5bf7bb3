"""The hash chain over audit records: pure functions, no storage.

Each stored record carries ``prev_hash`` (the hash of the record before it, or
:data:`GENESIS_HASH` for the first) and ``record_hash``::

    record_hash = sha256(prev_hash_hex || 0x0a || canonical_bytes(record))

``canonical_bytes`` is the compact JSON array of the record's fields in schema
column order (``seq`` first). An array rather than a sorted-key object: it is
just as unambiguous and several times cheaper to build on the writer thread.

Because ``seq`` is part of the canonical bytes, renumbering a record breaks its
hash just as editing any other field does.

``trace_id`` (schema version 2) is the array's last element only when it is
not empty, so records written before it existed keep their hashes; setting or
clearing it still changes the array, hence the hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from gateway.audit._schema import RECORD_COLUMNS
from gateway.audit.record import AuditRecord

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
    digest = hashlib.sha256(prev_hash.encode("utf-8"))
    digest.update(b"\n")
    digest.update(_canonical(fields))
    return digest.hexdigest()


def _canonical(fields: Mapping[str, object]) -> bytes:
    values = [fields[name] for name in RECORD_COLUMNS]
    if values[-1] == "":  # trace_id: absent from version-1 hashes
        values.pop()
    return _ENCODER.encode(values).encode("utf-8")


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
