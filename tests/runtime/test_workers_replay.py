"""Probe: one request id sent to both workers at the same moment runs exactly once.

``workers = 2`` served by ``a2a-gateway serve``; one channel per worker
(``worker.pid`` says which). ``notes.append`` (tests.helpers.crash_window) is a
write that appends one line per real run, so the runs are counted from the
file, not from answers. No idempotency key: only the shared replay window
stands between the two copies.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError, ReplayedRequest
from tests.helpers.agent_process import one_client_per_worker, two_worker_agent, worker_pids
from tests.helpers.agents import Pki, audit_rows, grant, spiffe
from tests.helpers.crash_window import appended_lines

pytestmark = pytest.mark.slow

MAX_CHANNELS = 32
ROUNDS = 6


async def test_one_request_id_on_both_workers_at_once_runs_once_and_both_are_audited(
    pki: Pki, tmp_path: Path
) -> None:
    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["worker.pid", "notes.append"])])
    opened: list[PeerClient] = []
    outcomes: list[list[object]] = []
    try:
        address = agent.start()
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            assert sorted(by_pid) == sorted(worker_pids(agent))
            first, second = by_pid.values()
            for n in range(ROUNDS):
                start = asyncio.Event()

                async def call(
                    client: PeerClient, n: int = n, start: asyncio.Event = start
                ) -> object:
                    await start.wait()
                    return await client.invoke(
                        "notes.append", {"note": f"r{n}"}, request_id=f"same-{n}", timeout=1.5
                    )

                calls = [asyncio.create_task(call(c)) for c in (first, second)]
                await asyncio.sleep(0)
                start.set()
                outcomes.append(list(await asyncio.gather(*calls, return_exceptions=True)))
        finally:
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()

    assert appended_lines(tmp_path / "state") == [f"r{n}" for n in range(ROUNDS)]  # once each
    for pair in outcomes:
        refused = [o for o in pair if isinstance(o, BaseException)]
        assert len(refused) == 1 and isinstance(refused[0], ReplayedRequest), pair
        assert not isinstance(refused[0], GatewayError) or refused[0].reason == "REPLAYED_REQUEST"
    rows = [r for r in audit_rows(tmp_path / "audit.sqlite") if r.capability == "notes.append"]
    for n in range(ROUNDS):
        mine = sorted((r.decision, r.reason) for r in rows if r.request_id == f"same-{n}")
        assert mine == [("allow", "ADMITTED"), ("allow", "OK"), ("refuse", "REPLAYED_REQUEST")]


async def test_one_a2a_message_id_on_both_workers_at_once_runs_once(
    pki: Pki, tmp_path: Path
) -> None:
    import grpc
    from a2a.types import a2a_pb2_grpc

    from gateway.transport.tls import channel_options
    from tests.helpers.a2a_grpc import V1, data_request, gateway_reason

    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["worker.pid", "notes.append"])])
    opened: list[PeerClient] = []
    channels: list[grpc.aio.Channel] = []
    answers: list[list[str]] = []
    try:
        address = agent.start()
        try:
            by_pid = await one_client_per_worker(pki, address, opened)
            assert sorted(by_pid) == sorted(worker_pids(agent))
            stubs: dict[int, a2a_pb2_grpc.A2AServiceStub] = {}
            for _ in range(MAX_CHANNELS):  # A2A channels, one per worker
                channel = grpc.aio.secure_channel(
                    address,
                    pki.material("bob").channel_credentials(),
                    options=channel_options(spiffe("alice")),
                )
                channels.append(channel)
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                answer = await stub.SendMessage(
                    data_request("worker.pid", {}), metadata=V1, timeout=20
                )
                pid = int(answer.task.artifacts[0].parts[0].data.struct_value["pid"])
                stubs.setdefault(pid, stub)
                if len(stubs) == 2:
                    break
            assert sorted(stubs) == sorted(by_pid)
            for n in range(ROUNDS):
                start = asyncio.Event()

                async def send(
                    stub: a2a_pb2_grpc.A2AServiceStub, n: int = n, start: asyncio.Event = start
                ) -> str:
                    request = data_request("notes.append", {"note": f"a{n}"}, message_id=f"m-{n}")
                    request.configuration.return_immediately = n % 2 == 1
                    await start.wait()
                    try:
                        await stub.SendMessage(request, metadata=V1, timeout=2.0)
                    except grpc.aio.AioRpcError as err:
                        return gateway_reason(err)
                    return "OK"

                calls = [asyncio.create_task(send(s)) for s in stubs.values()]
                await asyncio.sleep(0)
                start.set()
                answers.append(sorted(await asyncio.gather(*calls)))
                for _ in range(200):  # a background run appends soon after its answer
                    if f"a{n}" in appended_lines(tmp_path / "state"):
                        break
                    await asyncio.sleep(0.05)
        finally:
            for channel in channels:
                await channel.close()
            for client in opened:
                await client.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    assert answers == [["OK", "REPLAYED_REQUEST"]] * ROUNDS
    assert sorted(appended_lines(tmp_path / "state")) == sorted(f"a{n}" for n in range(ROUNDS))
    rows = audit_rows(tmp_path / "audit.sqlite")
    replayed = [r for r in rows if r.reason == "REPLAYED_REQUEST"]
    assert sorted(r.request_id for r in replayed) == [f"m-{n}" for n in range(ROUNDS)]
