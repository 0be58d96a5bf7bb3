"""Run by tests/unit/test_hotpath.py in a fresh interpreter, once per path.

``python -m tests.unit.hotpath_probe results``: which path runs, and what the
record and chain functions answer (bytes, hashes, errors) for a fixed set of
records, valid and not, as JSON. ``write DB``: a log of the same valid records
written by this path. ``verify DB``: this path's verification of a log, and
its stored hashes. ``calls DIR``: a real agent's ``InvokeHandler`` (certificates
minted in DIR) given a fixed set of calls, allowed, refused and failing, then
a few more over real gRPC through its servicer (Invoke, a corrupt message,
Describe): each answer, the audit records they left and how often the write
capability ran.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import sqlite3
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from capabilities import CallContext, ContractModel, capability
from gateway import hotpath
from gateway.audit import AuditLog, AuditRecord, verify_chain
from gateway.audit.chain import GENESIS_HASH, canonical_bytes, chained_row, record_hash
from gateway.audit.record import checked_fields
from gateway.errors import GatewayError
from gateway.inbound.call import InvokeCall
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


class Nothing(ContractModel):
    """test.slow's input and output."""

    n: int = 0


@capability("test.slow", "1.0.0", risk="read", timeout=0.05)
async def slow(inp: Nothing, ctx: CallContext) -> Nothing:
    """Sleeps past its timeout (a failure after admission)."""
    await asyncio.sleep(5)
    return Nothing()


CALLS: list[dict[str, Any]] = [
    {"capability": "text.echo", "payload": b'{"text":"hi"}'},
    {"capability": "text.echo", "payload": b'{"text":"hi"}', "request_id": "call-0"},
    {"capability": "text.search", "payload": b'{"query":"x"}'},
    {"capability": "no.such", "payload": b"{}"},
    {"capability": "text.echo", "version_constraint": "^9", "payload": b'{"text":"x"}'},
    {"capability": "text.echo", "version_constraint": "^^", "payload": b'{"text":"x"}'},
    {"capability": "text.echo", "payload": b'{"text":1}'},
    {"capability": "text.echo", "payload": b"not json"},
    {"capability": "text.echo", "payload": b'{"text":"x"}', "task_id": "t\u202e"},
    {"capability": "text.echo", "payload": b'{"text":"x"}', "request_id": "bad id"},
    {"capability": "text.echo", "payload": b'{"text":"x"}', "cert": None},
    {"capability": "text.echo", "payload": b'{"text":"x"}', "deadline": -1.0},
    {"capability": "notes.write", "payload": b'{"note":"a"}', "idempotency_key": "k1"},
    {"capability": "notes.write", "payload": b'{"note":"a"}', "idempotency_key": "k1"},
    {"capability": "notes.write", "payload": b'{"note":"b"}', "idempotency_key": "k1"},
    {"capability": "notes.write", "payload": b'{"note":"c"}', "task_id": "task-1"},
    {"capability": "test.slow", "payload": b"{}"},
]
"""Calls every path must answer, audit and run (or not) alike."""
GRPC_CALLS: list[dict[str, Any]] = [
    {"capability": "text.echo", "payload": b'{"text":"hi"}'},
    {"capability": "text.echo", "payload": b'{"text":"hi"}', "request_id": "grpc-0"},
    {"capability": "text.search", "payload": b'{"query":"x"}'},
    {"capability": "text.echo", "payload": b"not json"},
    {"capability": "notes.write", "payload": b'{"note":"g"}', "idempotency_key": "g1"},
]
"""The same kinds of call over gRPC: the servicer (compiled too) answers them alike."""


async def _grpc_calls(pki: Any, agent: Any) -> list[Any]:
    import grpc

    from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
    from tests.support import raw_channel

    answers: list[Any] = []
    async with raw_channel(pki, agent, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        corrupt = channel.unary_unary("/a2agw.v1.PeerGateway/Invoke")
        requests = [
            gateway_pb2.InvokeRequest(
                request_id=spec.get("request_id", f"grpc-{n}"),
                capability=spec["capability"],
                payload=spec["payload"],
                idempotency_key=spec.get("idempotency_key", ""),
            )
            for n, spec in enumerate(GRPC_CALLS)
        ]
        sends: list[Any] = [partial(stub.Invoke, request, timeout=30) for request in requests]
        sends.append(partial(corrupt, b"\xff\xff\xff", timeout=30))  # not an InvokeRequest
        sends.append(partial(stub.Describe, gateway_pb2.DescribeRequest(), timeout=30))
        for send in sends:  # one at a time, in order: the replay must follow its first
            try:
                response = await send()
            except grpc.aio.AioRpcError as err:
                trailers = {
                    k: v.hex() if isinstance(v, bytes) else v
                    for k, v in err.trailing_metadata() or ()
                }
                answers.append([err.code().name, err.details(), trailers])
            else:
                if isinstance(response, gateway_pb2.DescribeResponse):
                    assert response.grant_expires_at  # the policy's, written at each run's time
                    response.ClearField("grant_expires_at")
                answers.append(response.SerializeToString(deterministic=True).hex())
    return answers


async def _calls(base: Path) -> dict[str, Any]:
    from tests.support import (
        WriteCounter,
        agent_config,
        audit_rows,
        grant,
        make_pki,
        standard_registry,
        started,
        write_policy,
    )

    pki = make_pki(base)
    allowed = ["text.echo", "notes.write", "test.slow"]
    policy = write_policy(base / "policy.toml", [grant("bob", allowed)])
    counter = WriteCounter()
    registry = standard_registry(counter, base / "state")
    registry.register(slow)
    config = agent_config(pki, base, "alice", policy)
    agent = await started(config, registry)
    cert = pki.material("bob").cert_pem
    answers: list[Any] = []
    try:
        for n, spec in enumerate(CALLS):
            call = InvokeCall(
                spec.get("cert", cert),
                spec.get("request_id", f"call-{n}"),
                spec["capability"],
                spec.get("version_constraint", ""),
                spec["payload"],
                time.monotonic() + spec.get("deadline", 30.0),
                task_id=spec.get("task_id", ""),
                idempotency_key=spec.get("idempotency_key", ""),
            )
            try:
                outcome = await agent.handler.invoke(call)
            except GatewayError as err:
                answers.append([type(err).__name__, err.reason, str(err), err.detail])
            else:
                answers.append([outcome.served_version, outcome.payload.hex(), outcome.remembered])
        over_grpc = await _grpc_calls(pki, agent)
        await agent.audit.flush()
    finally:
        await agent.stop()
    records = [
        {k: v for k, v in rec.to_json_dict().items() if k not in ("time_unix_ms", "latency_ms")}
        for rec in audit_rows(config.audit_db)
    ]
    return {
        "active": hotpath.ACTIVE,
        "answers": answers,
        "grpc": over_grpc,
        "records": records,
        "writes": counter.calls,
    }


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
    elif command == "calls":
        with tempfile.TemporaryDirectory(dir=sys.argv[2]) as base:
            print(json.dumps(asyncio.run(_calls(Path(base)))))


if __name__ == "__main__":
    main()
