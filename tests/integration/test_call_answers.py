"""One table of calls through a real agent: each one's answer, its records, what ran.

Allowed, replayed, refused, malformed, idempotent and timed-out calls go to the
handler every transport uses, then the same kinds of call over real mTLS gRPC
through the servicer (plus a corrupt message and Describe): every answer is
the one expected, every call leaves its records, and the write capability
ran exactly for the calls that were let through to run it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from capabilities import CallContext, ContractModel, capability
from gateway.errors import GatewayError
from gateway.inbound.call import InvokeCall
from gateway.runtime.agent import Agent
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.support import (
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


class Nothing(ContractModel):
    """test.slow's input and output."""

    n: int = 0


@capability("test.slow", "1.0.0", risk="read", timeout=0.05)
async def slow(inp: Nothing, ctx: CallContext) -> Nothing:
    """Sleeps past its timeout (a failure after admission)."""
    await asyncio.sleep(5)
    return Nothing()


ECHO = b'{"text":"x"}'
CALLS: list[tuple[dict[str, Any], str]] = [
    ({"capability": "text.echo", "payload": b'{"text":"hi"}'}, "OK"),
    (
        {"capability": "text.echo", "payload": b'{"text":"hi"}', "request_id": "call-0"},
        "REPLAYED_REQUEST",
    ),
    ({"capability": "text.search", "payload": b'{"query":"x"}'}, "CAPABILITY_NOT_GRANTED"),
    ({"capability": "no.such", "payload": b"{}"}, "CAPABILITY_NOT_GRANTED"),
    (
        {"capability": "text.echo", "version_constraint": "^9", "payload": ECHO},
        "VERSION_NOT_AVAILABLE",
    ),
    (
        {"capability": "text.echo", "version_constraint": "^^", "payload": ECHO},
        "INVALID_REQUEST",
    ),
    ({"capability": "text.echo", "payload": b'{"text":1}'}, "INVALID_INPUT"),
    ({"capability": "text.echo", "payload": b"not json"}, "INVALID_INPUT"),
    ({"capability": "text.echo", "payload": ECHO, "task_id": "t\u202e"}, "INVALID_REQUEST"),
    ({"capability": "text.echo", "payload": ECHO, "request_id": "bad id"}, "INVALID_REQUEST"),
    ({"capability": "text.echo", "payload": ECHO, "cert": None}, "UNAUTHENTICATED"),
    ({"capability": "text.echo", "payload": ECHO, "deadline": -1.0}, "DEADLINE_EXCEEDED"),
    ({"capability": "notes.write", "payload": b'{"note":"a"}', "idempotency_key": "k1"}, "OK"),
    ({"capability": "notes.write", "payload": b'{"note":"a"}', "idempotency_key": "k1"}, "OK"),
    (
        {"capability": "notes.write", "payload": b'{"note":"b"}', "idempotency_key": "k1"},
        "IDEMPOTENCY_CONFLICT",
    ),
    ({"capability": "notes.write", "payload": b'{"note":"c"}', "task_id": "task-1"}, "OK"),
    ({"capability": "test.slow", "payload": b"{}"}, "CAPABILITY_TIMEOUT"),
]
"""Calls to the handler, each with the reason it must end with."""
REMEMBERED = 13
"""The index of the call answered from the idempotency store (nothing ran)."""
GRPC_CALLS: list[dict[str, Any]] = [
    {"capability": "text.echo", "payload": b'{"text":"hi"}'},
    {"capability": "text.echo", "payload": b'{"text":"hi"}', "request_id": "grpc-0"},
    {"capability": "text.search", "payload": b'{"query":"x"}'},
    {"capability": "text.echo", "payload": b"not json"},
    {"capability": "notes.write", "payload": b'{"note":"g"}', "idempotency_key": "g1"},
]
"""The same kinds of call over gRPC; then a corrupt message and Describe."""


@pytest.fixture
async def agent(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "policy.toml", [grant("bob", ["text.echo", "notes.write", "test.slow"])]
    )
    registry = standard_registry(counter, tmp_path / "state")
    registry.register(slow)
    running = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    yield running
    await running.stop()


async def handler_answers(pki: Pki, agent: Agent) -> list[tuple[str, bool]]:
    """Each call's reason (``OK`` when answered) and whether it was served remembered."""
    cert = pki.material("bob").cert_pem
    answers: list[tuple[str, bool]] = []
    for n, (spec, _) in enumerate(CALLS):
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
            answers.append((err.reason, False))
        else:
            answers.append(("OK", outcome.remembered))
    return answers


async def grpc_codes(pki: Pki, agent: Agent) -> list[str]:
    """Each gRPC call's status code, in order (one at a time: a replay follows its first)."""
    codes: list[str] = []
    async with raw_channel(pki, agent, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        corrupt = channel.unary_unary("/a2agw.v1.PeerGateway/Invoke")
        sends: list[Any] = [
            partial(
                stub.Invoke,
                gateway_pb2.InvokeRequest(
                    request_id=spec.get("request_id", f"grpc-{n}"),
                    capability=spec["capability"],
                    payload=spec["payload"],
                    idempotency_key=spec.get("idempotency_key", ""),
                ),
                timeout=30,
            )
            for n, spec in enumerate(GRPC_CALLS)
        ]
        sends.append(partial(corrupt, b"\xff\xff\xff", timeout=30))  # not an InvokeRequest
        sends.append(partial(stub.Describe, gateway_pb2.DescribeRequest(), timeout=30))
        for send in sends:
            try:
                await send()
            except grpc.aio.AioRpcError as err:
                codes.append(err.code().name)
            else:
                codes.append("OK")
    return codes


async def test_every_call_is_answered_recorded_and_run_as_expected(
    pki: Pki, agent: Agent, counter: WriteCounter
) -> None:
    answers = await handler_answers(pki, agent)
    assert [reason for reason, _ in answers] == [reason for _, reason in CALLS]
    assert [n for n, (_, remembered) in enumerate(answers) if remembered] == [REMEMBERED]
    assert counter.calls == 2  # the replay and the conflict ran nothing
    assert await grpc_codes(pki, agent) == [
        "OK",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "INVALID_ARGUMENT",
        "OK",
        "INVALID_ARGUMENT",
        "OK",
    ]
    assert counter.calls == 3
    await agent.audit.flush()
    rows = audit_rows(agent.config.audit_db)
    # One record per call (Describe leaves none), plus the write-ahead ADMITTED
    # of each admitted write: four to the handler (the replay and the conflict
    # are admitted before the idempotency store answers), one over gRPC.
    assert [row.reason for row in rows].count("ADMITTED") == 5
    assert len(rows) == len(CALLS) + (len(GRPC_CALLS) + 1) + 5
