"""Run by tests/unit/test_hotpath.py in a fresh interpreter, once per path.

``python -m tests.unit.hotpath_probe results``: which path runs, and what the
record and chain functions answer (bytes, hashes, errors) for a fixed set of
records, valid and not, as JSON. ``write DB``: a log of the same valid records
written by this path. ``verify DB``: this path's verification of a log, and
its stored hashes.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import sqlite3
import sys
from pathlib import Path
from typing import Any

from gateway import hotpath
from gateway.audit import AuditLog, AuditRecord, verify_chain
from gateway.audit.chain import GENESIS_HASH, canonical_bytes, chained_row, record_hash
from gateway.audit.record import checked_fields
from gateway.storage import open_audit_reader, open_chain_writer

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
VALID: list[dict[str, Any]] = [
    {},
    {"decision": "refuse", "reason": "CAPABILITY_NOT_GRANTED", "served_version": ""},
    {"detail": 'quote " backslash \\ nul \x00 del \x7f', "latency_ms": 1e-07},
    {"detail": "bidi \u202e \u00e4\u00f6 \U0001f600", "trace_id": "cd" * 16, "seq": 7},
    {"peer_id": "", "task_id": "task-9", "step_id": "step-2", "latency_ms": 123456.789},
    {"time_unix_ms": 2**62, "payload_size": 0, "seq": 2**40},
]
"""Records the gateway writes: every path must give them the same bytes and hashes."""
ODD: list[dict[str, Any]] = [
    {"latency_ms": 2},
    {"payload_size": 3.0},
    {"payload_size": 3.5},
    {"payload_size": True},
    {"latency_ms": True},
    {"latency_ms": math.nan},
    {"latency_ms": math.inf},
    {"latency_ms": "1"},
    {"detail": b"raw"},
    {"detail": "\ud800"},
    {"decision": "maybe"},
    {"seq": -1},
]
"""Values no caller should give: every path must accept or refuse them alike."""


def _outcome(function: Any, *args: Any) -> Any:
    try:
        value = function(*args)
    except Exception as err:  # the type and text of the refusal are part of the result
        return {"error": type(err).__name__, "message": str(err)}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {key: [type(v).__name__, repr(v)] for key, v in value.items()}
    return repr(value)


def results() -> dict[str, Any]:
    """Every function's answer for every record, and which path gave them."""
    out: dict[str, Any] = {
        "active": hotpath.ACTIVE,
        "compiled": hotpath.is_compiled(),
        "files": {m: importlib.import_module(m).__file__ for m in hotpath.COMPILED_MODULES},
        "cases": [],
    }
    prev = GENESIS_HASH
    for change in VALID + ODD:
        try:
            rec = AuditRecord(**{**BASE, **change})
        except Exception as err:
            out["cases"].append({"construct": [type(err).__name__, str(err)]})
            continue
        checked = _outcome(checked_fields, rec)
        case = {
            "canonical": _outcome(canonical_bytes, rec),
            "hash": _outcome(record_hash, prev, rec),
            "checked": checked,
        }
        if "error" not in checked:
            try:
                row, digest = chained_row(prev, checked_fields(rec))
            except Exception as err:
                case["row"] = {"error": type(err).__name__, "message": str(err)}
            else:
                case["row"] = [type(v).__name__ + ":" + repr(v) for v in row]
                prev = digest
        out["cases"].append(case)
    return out


async def write(db: Path) -> None:
    """The valid records, through the real audit log and its writer thread."""
    log = AuditLog(open_chain_writer(db))
    await log.start()
    for change in VALID:
        log.record(AuditRecord(**{**BASE, **change}))
    await log.close()


def verify(db: Path) -> dict[str, Any]:
    """This path's verdict on the log at ``db``, and the hashes stored in it."""
    report = verify_chain(open_audit_reader(db))
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT prev_hash, record_hash FROM audit_records ORDER BY seq")
        hashes = [list(row) for row in stored]
    return {"ok": report.ok, "records": report.records, "hashes": hashes}


def main() -> None:
    """Entry point: ``results``, ``write DB`` or ``verify DB``; JSON on stdout."""
    command = sys.argv[1]
    if command == "results":
        print(json.dumps(results()))
    elif command == "write":
        asyncio.run(write(Path(sys.argv[2])))
        print(json.dumps({"active": hotpath.ACTIVE}))
    elif command == "verify":
        print(json.dumps({"active": hotpath.ACTIVE, **verify(Path(sys.argv[2]))}))


if __name__ == "__main__":
    main()
