"""Per-peer limits and the server-wide cap on a real agent over mTLS.

Counts only, never timings: rates are so low that no token refills during a test.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from a2a.utils import errors as a2a_errors

from gateway.audit.summary import calls_in as refused_count
from gateway.client.peer_client import PeerClient
from gateway.errors import ConcurrencyLimited, GatewayError, RateLimited, ServerBusy
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.a2a_grpc import A2APeer, data_request, gateway_reason, output_of
from tests.helpers.agents import (
    Pki,
    Probe,
    WriteCounter,
    audit_rows,
    grant,
    raw_channel,
    spiffe,
)
from tests.helpers.limits import NO_REFILL, limited, refused_by_reason, serve
from tests.helpers.waiting import until


async def test_burst_of_five_allows_five_writes_and_audits_every_refusal(
    pki: Pki, tmp_path: Path
) -> None:
    counter = WriteCounter()
    agent = await serve(
        pki,
        tmp_path,
        [limited("bob", ["notes.write"], max_calls_per_second=NO_REFILL, burst=5)],
        counter,
    )
    outcomes: list[str] = []
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            for index in range(12):
                try:
                    await bob.invoke("notes.write", {"note": f"n{index}"})
                    outcomes.append("OK")
                except GatewayError as err:
                    outcomes.append(err.reason)
        assert outcomes == ["OK"] * 5 + ["RATE_LIMITED"] * 7
        assert counter.calls == 5  # refused calls never reached the write capability
        stats = agent.limit_stats()
        assert dict(stats.rate_limited) == {spiffe("bob"): 7}
    finally:
        await agent.stop()
    assert refused_by_reason(agent, "bob") == {"RATE_LIMITED": 7}
    db = str(agent.config.audit_db)
    summary = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", "audit", "--db", db, "--summary", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [json.loads(line) for line in summary.stdout.splitlines()]
    assert {(r["decision"], r["reason"], r["calls"]) for r in rows} == {
        ("allow", "ADMITTED", 5),
        ("allow", "OK", 5),
        ("refuse", "RATE_LIMITED", 7),
    }


async def test_rate_limited_is_resource_exhausted_on_the_wire(pki: Pki, tmp_path: Path) -> None:
    agent = await serve(
        pki,
        tmp_path,
        [limited("bob", ["text.echo"], max_calls_per_second=NO_REFILL, burst=1)],
        WriteCounter(),
    )
    try:
        async with raw_channel(pki, agent, "bob") as channel:
            stub = gateway_pb2_grpc.PeerGatewayStub(channel)
            request = gateway_pb2.InvokeRequest(
                request_id="r1", capability="text.echo", payload=b'{"text":"a"}'
            )
            await stub.Invoke(request, timeout=10)
            # Not even parsed: a broken payload is refused for the rate, not INVALID_INPUT.
            broken = gateway_pb2.InvokeRequest(request_id="r2", capability="x", payload=b"{")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Invoke(broken, timeout=10)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await agent.stop()
    assert refused_by_reason(agent, "bob") == {"RATE_LIMITED": 1}


async def test_max_in_flight_refuses_while_calls_are_held_and_frees_slots(
    pki: Pki, tmp_path: Path
) -> None:
    probe = Probe()
    counter = WriteCounter()
    agent = await serve(
        pki,
        tmp_path,
        [limited("bob", ["slow.wait", "notes.write", "text.echo"], max_in_flight=2)],
        counter,
        probe,
    )
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            held = [asyncio.create_task(bob.invoke("slow.wait", {})) for _ in range(2)]
            await until(lambda: probe.waits == 2, "two held calls")
            with pytest.raises(ConcurrencyLimited):
                await bob.invoke("notes.write", {"note": "x"})
            assert counter.calls == 0
            probe.release.set()
            assert [(await task).output() for task in held] == [{"done": True}] * 2
            # Refused after its slot was taken (bad input): the slot comes back.
            for _ in range(3):
                with pytest.raises(GatewayError) as info:
                    await bob.invoke("text.echo", {"nope": 1})
                assert info.value.reason == "INVALID_INPUT"
            await bob.invoke("notes.write", {"note": "y"})
        assert counter.calls == 1
        assert agent.limit_stats().in_flight_total == 0
        assert dict(agent.limit_stats().concurrency_limited) == {spiffe("bob"): 1}
    finally:
        probe.release.set()
        await agent.stop()
    assert refused_by_reason(agent, "bob") == {"CONCURRENCY_LIMITED": 1, "INVALID_INPUT": 3}


async def test_server_wide_cap_refuses_any_peer_with_server_busy(pki: Pki, tmp_path: Path) -> None:
    probe = Probe()
    agent = await serve(
        pki,
        tmp_path,
        [grant("bob", ["slow.wait"]), grant("carol", ["text.echo"])],
        WriteCounter(),
        probe,
        max_concurrent_calls=1,
    )
    try:
        async with (
            PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob,
            PeerClient(agent.config.id, agent.address, pki.material("carol")) as carol,
        ):
            held = asyncio.create_task(bob.invoke("slow.wait", {}))
            await until(lambda: probe.waits == 1, "the held call")
            with pytest.raises(ServerBusy):
                await carol.invoke("text.echo", {"text": "hi"})
            probe.release.set()
            await held
            assert (await carol.invoke("text.echo", {"text": "hi"})).output() == {"text": "hi"}
    finally:
        probe.release.set()
        await agent.stop()
    assert refused_by_reason(agent, "carol") == {"SERVER_BUSY": 1}


async def test_a_flood_of_refusals_keeps_audit_rows_per_interval_and_others_served(
    pki: Pki, tmp_path: Path
) -> None:
    flood, batch = 2000, 100
    agent = await serve(
        pki,
        tmp_path,
        [
            limited("bob", ["text.echo"], max_calls_per_second=NO_REFILL, burst=1),
            grant("carol", ["text.echo"]),
        ],
        WriteCounter(),
    )
    served = 0
    try:
        async with (
            raw_channel(pki, agent, "bob") as channel,
            PeerClient(agent.config.id, agent.address, pki.material("carol")) as carol,
        ):
            stub = gateway_pb2_grpc.PeerGatewayStub(channel)
            await stub.Invoke(
                gateway_pb2.InvokeRequest(
                    request_id="first", capability="text.echo", payload=b'{"text":"a"}'
                ),
                timeout=10,
            )

            async def refused_call(index: int) -> grpc.StatusCode:
                request = gateway_pb2.InvokeRequest(
                    request_id=f"f{index}", capability="text.echo", payload=b'{"text":"a"}'
                )
                try:
                    await stub.Invoke(request, timeout=30)
                except grpc.aio.AioRpcError as err:
                    return err.code()
                return grpc.StatusCode.OK

            for start in range(0, flood, batch):
                codes, answer = await asyncio.gather(
                    asyncio.gather(*(refused_call(i) for i in range(start, start + batch))),
                    carol.invoke("text.echo", {"text": "still served"}),
                )
                assert set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
                assert answer.output() == {"text": "still served"}
                served += 1
        assert dict(agent.limit_stats().rate_limited) == {spiffe("bob"): flood}
    finally:
        await agent.stop()
    assert served == flood // batch
    rows = [
        r
        for r in audit_rows(agent.config.audit_db)
        if r.peer_id == spiffe("bob") and r.reason == RateLimited.reason
    ]
    assert sum(refused_count(r) for r in rows) == flood
    # One durable row and one count row per second at most: far below one per call.
    assert len(rows) <= 2 * (int(rows[-1].time_unix_ms - rows[0].time_unix_ms) // 1000 + 2)
    assert len(rows) < flood // 10


async def test_a2a_send_message_takes_the_same_limits_and_gives_slots_back(
    pki: Pki, tmp_path: Path
) -> None:
    agent = await serve(
        pki,
        tmp_path,
        [limited("bob", ["text.echo"], max_in_flight=1, max_calls_per_second=NO_REFILL, burst=3)],
        WriteCounter(),
    )
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            # max_in_flight 1: three calls in a row pass only if each gives its slot back.
            for text in ("a", "b", "c"):
                task = await bob.send(data_request("text.echo", {"text": text}))
                assert output_of(task) == {"text": text}
            with pytest.raises(a2a_errors.A2AError) as info:
                await bob.send(data_request("text.echo", {"text": "d"}))
        assert gateway_reason(info.value) == "RATE_LIMITED"
        assert agent.limit_stats().in_flight_total == 0
    finally:
        await agent.stop()
    assert refused_by_reason(agent, "bob") == {"RATE_LIMITED": 1}
