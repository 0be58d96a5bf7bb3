"""A peer cannot forge rows in the operator's audit view, nor drive their terminal.

Names and ids with control or bidi characters are refused at the door
(INVALID_REQUEST, audited with the fields escaped); rows an older writer stored
verbatim are escaped when shown. ``a2a-gateway audit`` is run as operators run
it, on real logs; ``--json`` keeps every value exact.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import grpc
import pytest

from gateway.audit import AuditLog, AuditRecord
from gateway.display import has_unsafe_characters
from gateway.runtime.agent import Agent
from gateway.storage import open_chain_writer
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.agents import Pki, WriteCounter, audit_rows, raw_channel
from tests.helpers.cli import run_cli_async

BOB = "spiffe://example.org/agent/bob"
FAKE_ROW = "\n2026-01-01T00:00:00.000Z  spiffe://example.org/agent/bob  kv.put  -  1.0.0  allow  OK"
HOSTILE = {
    "newline (forged row)": FAKE_ROW,
    "CR": "\rallowed",
    "ESC clear screen": "\x1b[2J\x1b[H",
    "vertical tab": "\x0b",
    "NUL": "\x00",
    "DEL": "\x7f",
    "NEL (C1)": "\x85",
    "CSI (C1)": "\x9b2J",
    "line separator": "\u2028",
    "paragraph separator": "\u2029",
    "right-to-left override": "\u202eetirw",
    "left-to-right isolate": "\u2066x\u2069",
    "right-to-left mark": "\u200f",
    "arabic letter mark": "\u061c",
}
FIELDS = ("capability", "version_constraint", "task_id", "step_id", "idempotency_key")


async def run_audit(db: Path, *args: str) -> str:
    """``a2a-gateway audit`` as an operator runs it: what reaches their terminal."""
    result = await run_cli_async("audit", "--db", str(db), *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _forged_request(field: str, text: str) -> gateway_pb2.InvokeRequest:
    envelope = {"capability": "notes.write", field: f"x{text}"}
    return gateway_pb2.InvokeRequest(
        request_id=f"forge-{uuid.uuid4().hex}", payload=b'{"note":"n"}', **envelope
    )


@pytest.mark.parametrize("field", FIELDS)
async def test_control_or_bidi_in_any_name_or_id_is_refused_at_the_door(
    pki: Pki, alice: Agent, counter: WriteCounter, field: str
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    async with raw_channel(pki, alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        for name, text in HOSTILE.items():
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Invoke(_forged_request(field, text), timeout=10)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, name
            assert info.value.details() == f"{field} holds a control or bidi character", name
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.decision, r.reason, r.peer_id) for r in rows] == [
        ("refuse", "INVALID_REQUEST", BOB)
    ] * len(HOSTILE)
    for row in rows:  # stored escaped, so even a raw reader of the log sees no controls
        stored = (row.capability, row.version_constraint, row.task_id, row.step_id)
        assert not any(has_unsafe_characters(value) for value in stored)
    assert counter.calls == 0


async def test_audit_cli_shows_door_refusals_one_row_each(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    async with raw_channel(pki, alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        for text in HOSTILE.values():
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Invoke(_forged_request("capability", text), timeout=10)
    await alice.audit.flush()
    rows = audit_rows(alice.config.audit_db)

    table = await run_audit(alice.config.audit_db)

    lines = table.splitlines()
    assert len(lines) == len(rows) + 1
    assert not has_unsafe_characters(table.replace("\n", ""))
    assert not any(line.startswith("2026-01-01") for line in lines)  # the forged row is not a row
    assert "x\\x0a2026-01-01T00:00:00.000Z" in table


def _legacy_record(n: int, text: str) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=1_700_000_000_000 + n,
        request_id=f"legacy-{n}",
        peer_id=BOB,
        capability=f"cap{text}",
        version_constraint=text,
        served_version="",
        decision="refuse",
        reason="CAPABILITY_NOT_GRANTED",
        payload_size=0,
        payload_sha256=hashlib.sha256(b"").hexdigest(),
        latency_ms=0.5,
        task_id=text,
        step_id=text,
    )


@pytest.fixture
async def legacy_log(tmp_path: Path) -> Path:
    """A log an older gateway wrote: names and ids stored verbatim, controls and all."""
    log = AuditLog(open_chain_writer(tmp_path / "legacy-audit.sqlite"))
    await log.start()
    for n, text in enumerate(HOSTILE.values()):
        await log.record_durable(_legacy_record(n, text))
    await log.close()
    return tmp_path / "legacy-audit.sqlite"


async def test_audit_cli_escapes_rows_stored_verbatim(legacy_log: Path) -> None:
    table = await run_audit(legacy_log)

    lines = table.splitlines()
    assert len(lines) == len(HOSTILE) + 1  # header + every record, nothing more
    assert not has_unsafe_characters(table.replace("\n", ""))
    assert sum(line.count("legacy-") for line in lines) == len(HOSTILE)
    assert "cap\\u202eetirw" in table and "cap\\x1b[2J\\x1b[H" in table


async def test_audit_cli_json_keeps_every_value_exact(legacy_log: Path) -> None:
    text = await run_audit(legacy_log, "--json")

    assert not has_unsafe_characters(text.replace("\n", ""))
    got = [json.loads(line) for line in text.split("\n") if line]
    expected = [record.to_json_dict() for record in audit_rows(legacy_log)]
    assert got == expected
    assert got[10]["capability"] == "cap\u202eetirw"  # bidi kept as data
    assert got[0]["task_id"] == FAKE_ROW


async def test_lone_surrogate_from_a_json_transport_is_refused_and_the_log_keeps_writing(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    # gRPC strings are UTF-8, but a JSON transport decodes "\\udc80" into a lone
    # surrogate, which SQLite cannot store: the audit writer must never see one.
    from gateway.errors import InvalidRequest
    from gateway.inbound.call import InvokeCall

    call = InvokeCall(
        peer_cert_pem=pki.material("bob").cert_pem,
        request_id=f"json-{uuid.uuid4().hex}",
        capability="notes.write\udc80",
        version_constraint="",
        payload=b'{"note":"n"}',
        deadline=1e12,
        task_id="t\ud800",
    )
    with pytest.raises(InvalidRequest):
        await alice.handler.invoke(call)
    row = audit_rows(alice.config.audit_db)[-1]
    assert (row.reason, row.capability, row.task_id) == (
        "INVALID_REQUEST",
        "notes.write\\udc80",
        "t\\ud800",
    )
    assert alice.audit.healthy
    assert counter.calls == 0
