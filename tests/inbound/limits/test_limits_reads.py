"""Limits apply to every method: Describe, the A2A card and task reads, not only calls.

Counts only, never timings: rates are so low that no token refills during a test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2

from gateway.client.peer_client import PeerClient
from gateway.inbound.limits.refusal_log import LimitRefusalLog
from gateway.transport.status import from_rpc_error
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.a2a_grpc import V1, A2APeer, data_request, poisoned
from tests.helpers.agents import Pki, Probe, WriteCounter, audit_rows, spiffe
from tests.helpers.limits import NO_REFILL, limited, refused_by_reason, serve
from tests.helpers.waiting import until

Read = Callable[[A2APeer], Awaitable[Any]]


def reads(task_id: str) -> dict[str, Read]:
    """Every method that names no capability, as bob would call it."""

    async def describe(peer: A2APeer) -> Any:
        return await gateway_pb2_grpc.PeerGatewayStub(peer.channel).Describe(
            gateway_pb2.DescribeRequest(), timeout=10
        )

    async def stream(peer: A2APeer) -> Any:
        request = data_request("text.echo", {"text": "t"})
        return [e async for e in peer.stub.SendStreamingMessage(request, metadata=V1)]

    return {
        "GetTask": lambda p: p.stub.GetTask(a2a_pb2.GetTaskRequest(id=task_id), metadata=V1),
        "GetTask (unknown id)": lambda p: p.stub.GetTask(
            a2a_pb2.GetTaskRequest(id="no-such-task"), metadata=V1
        ),
        "ListTasks": lambda p: p.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=V1),
        "CancelTask": lambda p: p.stub.CancelTask(
            a2a_pb2.CancelTaskRequest(id=task_id), metadata=V1
        ),
        "GetExtendedAgentCard": lambda p: p.stub.GetExtendedAgentCard(
            a2a_pb2.GetExtendedAgentCardRequest(), metadata=V1
        ),
        "SendStreamingMessage": stream,
        "Describe": describe,
    }


async def reason_of(read: Read, peer: A2APeer) -> str:
    try:
        await read(peer)
    except grpc.aio.AioRpcError as err:
        return from_rpc_error(err).reason
    return "OK"


async def test_an_empty_bucket_refuses_every_read_and_audits_them_aggregated(
    pki: Pki, tmp_path: Path
) -> None:
    agent = await serve(
        pki,
        tmp_path,
        [limited("bob", ["text.echo"], max_calls_per_second=NO_REFILL, burst=3)],
        WriteCounter(),
    )
    # One aggregation window for the whole test, however slow the machine is.
    agent.handler.limit_refusals = LimitRefusalLog(agent.audit, interval=3600.0)
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            task = await bob.send(data_request("text.echo", {"text": "t"}))  # token 1
            methods = reads(task.id)
            assert await reason_of(methods["GetTask"], bob) == "OK"  # token 2
            assert await reason_of(methods["ListTasks"], bob) == "OK"  # token 3
            await agent.audit.flush()
            before = len(audit_rows(agent.config.audit_db))
            refused = 0
            for _ in range(5):
                for name, read in methods.items():
                    assert await reason_of(read, bob) == "RATE_LIMITED", name
                    refused += 1
            await agent.audit.flush()
            # One durable record for the first refusal of the interval; the rest counted.
            rows = audit_rows(agent.config.audit_db)[before:]
            assert [(r.reason, r.detail) for r in rows] == [("RATE_LIMITED", "count=1")]
            assert agent.handler.limit_refusals.pending() == refused - 1
            assert dict(agent.limit_stats().rate_limited) == {spiffe("bob"): refused}
    finally:
        await agent.stop()
    # Stopping writes the counts: every refusal accounted for, no TASK_NOT_FOUND flood.
    assert refused_by_reason(agent, "bob") == {"RATE_LIMITED": refused}


NEED_ROOM = ["GetExtendedAgentCard", "SendStreamingMessage", "Describe"]
POLLS = {
    "GetTask": "TASK_NOT_FOUND",
    "GetTask (unknown id)": "TASK_NOT_FOUND",
    "ListTasks": "OK",
    "CancelTask": "TASK_NOT_FOUND",
}


def test_every_read_is_either_a_poll_or_needs_room() -> None:
    assert sorted([*NEED_ROOM, *POLLS]) == sorted(reads("t-1"))


@pytest.mark.parametrize("method", NEED_ROOM)
async def test_a_read_needs_room_under_the_peers_in_flight_cap(
    pki: Pki, tmp_path: Path, method: str
) -> None:
    probe = Probe()
    agent = await serve(
        pki, tmp_path, [limited("bob", ["slow.wait"], max_in_flight=1)], WriteCounter(), probe
    )
    try:
        async with (
            PeerClient(agent.config.id, agent.address, pki.material("bob")) as client,
            A2APeer(pki, agent, "bob") as bob,
        ):
            held = asyncio.create_task(client.invoke("slow.wait", {}))
            await until(lambda: probe.waits == 1, "the held call")
            assert await reason_of(reads("t-1")[method], bob) == "CONCURRENCY_LIMITED"
            probe.release.set()
            await held
            # The read gave its slot back: a call fits again.
            assert await reason_of(reads("t-1")["ListTasks"], bob) == "OK"
            assert agent.limit_stats().in_flight_total == 0
    finally:
        probe.release.set()
        await agent.stop()
    assert refused_by_reason(agent, "bob") == {"CONCURRENCY_LIMITED": 1}


@pytest.mark.parametrize(("method", "answer"), POLLS.items())
async def test_a_poll_of_ones_tasks_needs_no_free_place(
    pki: Pki, tmp_path: Path, method: str, answer: str
) -> None:
    # A peer whose running work holds its only place must still see that work end.
    probe = Probe()
    agent = await serve(
        pki, tmp_path, [limited("bob", ["slow.wait"], max_in_flight=1)], WriteCounter(), probe
    )
    try:
        async with (
            PeerClient(agent.config.id, agent.address, pki.material("bob")) as client,
            A2APeer(pki, agent, "bob") as bob,
        ):
            held = asyncio.create_task(client.invoke("slow.wait", {}))
            await until(lambda: probe.waits == 1, "the held call")
            assert await reason_of(reads("t-1")[method], bob) == answer
            assert agent.limit_stats().in_flight_total == 1  # the poll held nothing
            probe.release.set()
            await held
    finally:
        probe.release.set()
        await agent.stop()
    assert "CONCURRENCY_LIMITED" not in refused_by_reason(agent, "bob")


async def test_a_rate_limited_message_is_refused_before_its_data_part_is_decoded(
    pki: Pki, tmp_path: Path
) -> None:
    agent = await serve(
        pki,
        tmp_path,
        [limited("bob", ["text.echo"], max_calls_per_second=NO_REFILL, burst=1)],
        WriteCounter(),
    )
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            assert await reason_of(methods_of_send(poisoned("text.echo", 0)), bob) == (
                "INVALID_REQUEST"  # decoded: the NaN is found
            )
            request = poisoned("text.echo", 100_000)
            assert await reason_of(methods_of_send(request), bob) == "RATE_LIMITED"
        await agent.audit.flush()
        record = audit_rows(agent.config.audit_db)[-1]
        assert (record.reason, record.payload_size, record.payload_sha256) == (
            "RATE_LIMITED",
            request.message.parts[0].data.ByteSize(),
            "",
        )
    finally:
        await agent.stop()


def methods_of_send(request: a2a_pb2.SendMessageRequest) -> Read:
    return lambda peer: peer.stub.SendMessage(request, metadata=V1, timeout=10)
