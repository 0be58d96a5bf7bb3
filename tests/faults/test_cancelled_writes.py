"""Cancelled writes and idempotency keys, and deadlines that are not deadlines.

A key may be left in doubt only when the write may have happened. A call that
gRPC cancels while its key is being claimed never started the function: the
key must stay free, so a retry runs the write exactly once. A call cancelled
after the function started stays in doubt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from capabilities.context import CallContext
from capabilities.registry import Capability, capability
from gateway.runtime.agent import Agent
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.agents import (
    NoteInput,
    NoteOutput,
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    raw_channel,
    standard_registry,
    started,
    write_policy,
)

BOB = "spiffe://example.org/agent/bob"
_POLL_STEPS = 2000
"""Bounded waits: at most this many 10 ms turns for a state to appear (never asserted on)."""


@dataclass
class Gate:
    """A write capability whose start is observable and whose end the test decides."""

    runs: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def capability(self) -> Capability:
        @capability("gated.write", "1.0.0", risk="write", timeout=30.0, idempotent=True)
        async def gated(inp: NoteInput, ctx: CallContext) -> NoteOutput:
            """Count the run, then wait for the test."""
            self.runs += 1
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            return NoteOutput(stored=self.runs)

        return gated


@pytest.fixture
async def gate() -> Gate:
    return Gate()


@pytest.fixture
async def gated_alice(
    pki: Pki, tmp_path: Path, counter: WriteCounter, gate: Gate
) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write", "gated.write"])])
    registry = standard_registry(counter, tmp_path / "state")
    registry.register(gate.capability())
    agent = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    yield agent
    await agent.stop()


def _request(capability: str, key: str, **fields: object) -> gateway_pb2.InvokeRequest:
    return gateway_pb2.InvokeRequest(
        request_id=f"r-{uuid.uuid4().hex}",
        capability=capability,
        payload=json.dumps({"note": "n"}).encode(),
        idempotency_key=key,
        **fields,  # type: ignore[arg-type]
    )


async def _outcome(stub: gateway_pb2_grpc.PeerGatewayStub, request: object) -> tuple[str, object]:
    """("OK", reply) or (reason, status code)."""
    try:
        reply = await stub.Invoke(request, timeout=10)
    except grpc.aio.AioRpcError as err:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
        assert status is not None
        info = error_details_pb2.ErrorInfo()
        status.details[0].Unpack(info)
        return info.reason, err.code()
    return "OK", reply


async def _until(condition: object, what: str) -> None:
    for _ in range(_POLL_STEPS):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def _key_rows(agent: Agent, key: str) -> list[tuple[str, str]]:
    db = sqlite3.connect(agent.config.state_dir / "idempotency.sqlite")
    try:
        return db.execute("SELECT key, state FROM idempotency WHERE key = ?", (key,)).fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("deadline_unix_ms", [-1, -1000, -(2**63)])
async def test_negative_deadline_is_invalid_request_not_no_deadline(
    pki: Pki, alice: Agent, counter: WriteCounter, deadline_unix_ms: int
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    async with raw_channel(pki, alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        request = _request("notes.write", "", deadline_unix_ms=deadline_unix_ms)
        reason, code = await _outcome(stub, request)
    assert (reason, code) == ("INVALID_REQUEST", grpc.StatusCode.INVALID_ARGUMENT)
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.decision, r.reason, r.peer_id, r.capability) for r in rows] == [
        ("refuse", "INVALID_REQUEST", BOB, "notes.write")
    ]
    assert counter.calls == 0


async def test_call_cancelled_during_its_claim_leaves_the_key_free(
    pki: Pki, alice: Agent, counter: WriteCounter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.inbound.idempotency.store")
    store = alice.idempotency
    key = f"k-{uuid.uuid4().hex}"
    ident = (BOB, "notes.write", key)
    async with raw_channel(pki, alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        # A slow claim: the store's writer lock is held, so the claim's thread
        # waits inside the store while the call is cancelled.
        store._lock.acquire()
        try:
            call = stub.Invoke(_request("notes.write", key), timeout=10)
            await _until(lambda: ident in store._in_flight, "the claim to start")
            call.cancel()
            await _until(
                lambda: "cancelled while claiming" in caplog.text, "the server to see the cancel"
            )
        finally:
            store._lock.release()
        await _until(lambda: ident not in store._in_flight, "the claim to be abandoned")
        assert _key_rows(alice, key) == []
        assert counter.calls == 0

        first = await _outcome(stub, _request("notes.write", key))
        again = await _outcome(stub, _request("notes.write", key))
    assert first[0] == "OK" and not first[1].replayed  # type: ignore[attr-defined]
    assert again[0] == "OK" and again[1].replayed  # type: ignore[attr-defined]
    assert counter.calls == 1
    assert _key_rows(alice, key) == [(key, "done")]


async def test_call_cancelled_after_the_write_started_stays_in_doubt(
    pki: Pki, gated_alice: Agent, gate: Gate
) -> None:
    key = f"k-{uuid.uuid4().hex}"
    async with raw_channel(pki, gated_alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        call = stub.Invoke(_request("gated.write", key), timeout=10)
        await asyncio.wait_for(gate.started.wait(), 10)
        call.cancel()
        await asyncio.wait_for(gate.cancelled.wait(), 10)
        gate.release.set()

        retry = await _outcome(stub, _request("gated.write", key))
    assert retry == ("IDEMPOTENCY_IN_DOUBT", grpc.StatusCode.ABORTED)
    assert gate.runs == 1
    # The cut-off attempt's claim is marked in doubt (in the background), for an
    # operator to resolve; it is never dropped.
    await _until(
        lambda: _key_rows(gated_alice, key) == [(key, "in_doubt")], "the key to be in doubt"
    )
    await gated_alice.audit.flush()
    reasons = [
        r.reason for r in audit_rows(gated_alice.config.audit_db) if r.capability == "gated.write"
    ]
    assert reasons == ["ADMITTED", "CANCELLED", "ADMITTED", "IDEMPOTENCY_IN_DOUBT"]
