"""Races found by probing real agents, each pinned by a test that fails without its fix.

A write call cut off while its write-ahead ``ADMITTED`` record commits (its
deadline passes, its caller hangs up, or ``CancelTask`` reaches a background
task that has just started) must still get its outcome record: the ``ADMITTED``
record lands all the same, and an ``ADMITTED`` without an outcome reads as a
crash. Nothing ran, so the record says so. The audit writer is held inside the
batch holding ``ADMITTED`` (a slow disk) so the cut always falls in that window.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2

from capabilities.runner import NOT_STARTED
from gateway.runtime.agent import Agent
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.a2a_grpc import V1, A2APeer, data_request
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    WriteCounter,
    audit_rows,
    grant,
    raw_channel,
    spiffe,
)

_WAIT_SECONDS = 30.0
"""Bound of every wait on the held writer (never reached when the code is right)."""
_POLL_STEPS = 3000
"""Bounded waits: at most this many 10 ms turns for a state to appear (never asserted on)."""


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    """alice serving the counting write ``notes.write`` to bob."""
    return await make_agent(grants=[grant("bob", ["notes.write"])])


@contextmanager
def admitted_commit_held(agent: Agent) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the audit writer inside the batch holding an ``ADMITTED`` record.

    Yields (entered, release): ``entered`` is set once the writer holds such a
    batch; it commits it when ``release`` is set (or the bound passes).
    """
    writer = agent.audit._writer  # the store the log's thread appends to
    append = writer.append
    entered, release = threading.Event(), threading.Event()

    def held_append(records: Sequence[dict[str, object]]) -> None:
        if any(record.get("reason") == "ADMITTED" for record in records):
            entered.set()
            release.wait(_WAIT_SECONDS)
        append(records)

    writer.append = held_append  # type: ignore[method-assign]
    try:
        yield entered, release
    finally:
        release.set()
        writer.append = append  # type: ignore[method-assign]


async def test_cancel_task_while_admitted_commits_audits_its_outcome(
    alice: Agent, pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    request = data_request("notes.write", {"note": "x"}, idempotency_key="k-cancel")
    request.configuration.return_immediately = True
    async with A2APeer(pki, alice, "bob") as bob:
        with admitted_commit_held(alice) as (entered, release):
            answer = await bob.stub.SendMessage(request, metadata=V1, timeout=10)
            assert answer.task.status.state == a2a_pb2.TASK_STATE_SUBMITTED
            assert await asyncio.to_thread(entered.wait, _WAIT_SECONDS)
            cancelled = await bob.stub.CancelTask(
                a2a_pb2.CancelTaskRequest(id=answer.task.id), metadata=V1, timeout=10
            )
            release.set()
        assert cancelled.status.state == a2a_pb2.TASK_STATE_CANCELED
        # The key was never claimed: the same message again (a new id) writes once.
        again = data_request("notes.write", {"note": "x"}, idempotency_key="k-cancel")
        retried = await bob.stub.SendMessage(again, metadata=V1, timeout=10)
        assert retried.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    await alice.stop()
    assert counter.calls == 1
    rows = [r for r in audit_rows(tmp_path / "alice-audit.sqlite") if r.task_id == answer.task.id]
    assert [(r.decision, r.reason) for r in rows] == [
        ("allow", "ADMITTED"),
        ("allow", "CANCELLED"),
    ]
    assert rows[1].detail.startswith(f"A2A CancelTask by {spiffe('bob')}")
    assert rows[1].detail.endswith(NOT_STARTED)


async def test_invoke_past_its_deadline_while_admitted_commits_audits_its_outcome(
    alice: Agent, pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    request_id = uuid.uuid4().hex
    request = gateway_pb2.InvokeRequest(
        request_id=request_id, capability="notes.write", payload=b'{"note": "x"}'
    )
    async with raw_channel(pki, alice, "bob") as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)  # type: ignore[no-untyped-call]
        with admitted_commit_held(alice) as (entered, release):
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                await stub.Invoke(request, timeout=0.5)
            assert cut.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert entered.is_set()
            # The server-side call ends (its slot given back) only once it is cancelled.
            for _ in range(_POLL_STEPS):
                if alice.limit_stats().in_flight_total == 0:
                    break
                await asyncio.sleep(0.01)
            release.set()
    await alice.stop()
    assert counter.calls == 0
    rows = [r for r in audit_rows(tmp_path / "alice-audit.sqlite") if r.request_id == request_id]
    assert [(r.decision, r.reason, r.detail) for r in rows] == [
        ("allow", "ADMITTED", ""),
        ("allow", "CANCELLED", NOT_STARTED),
    ]
