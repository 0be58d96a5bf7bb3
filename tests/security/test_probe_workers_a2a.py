"""Probe: A2A tasks and limits over the A2A gRPC binding across the workers of one agent.

``workers = 2`` served by ``a2a-gateway serve`` (the HTTP bindings across
workers: ``tests/faults/test_workers_https.py``). Separate channels are
separate connections, which the kernel spreads over the workers;
``worker.pid`` says which worker a channel reaches.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import json_format

from gateway.transport.tls import channel_options
from tests.a2a_support import V1, data_request, gateway_reason
from tests.agent_process import AgentProcess, worker_pids, write_agent_toml
from tests.support import Pki, audit_rows, grant, spiffe, write_policy

MAX_CHANNELS = 32  # connections opened to find both workers (a bound, never asserted)


def _agent(pki: Pki, tmp_path: Path, grants: list[dict[str, object]]) -> AgentProcess:
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", grants),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
        modules=("tests.task_capabilities", "tests.faults.worker_pid"),
    )
    config.write_text("workers = 2\n" + config.read_text())
    return AgentProcess(config)


async def _pid_or_reason(stub: a2a_pb2_grpc.A2AServiceStub) -> int | str:
    try:
        answer = await stub.SendMessage(data_request("worker.pid", {}), metadata=V1, timeout=20)
    except grpc.aio.AioRpcError as err:
        return gateway_reason(err)
    data = answer.task.artifacts[0].parts[0].data
    return int(json_format.MessageToDict(data)["pid"])


async def _stubs_per_worker(
    pki: Pki, address: str, name: str, opened: list[grpc.aio.Channel]
) -> dict[int, a2a_pb2_grpc.A2AServiceStub]:
    by_pid: dict[int, a2a_pb2_grpc.A2AServiceStub] = {}
    for _ in range(MAX_CHANNELS):
        channel = grpc.aio.secure_channel(
            address,
            pki.material(name).channel_credentials(),
            options=channel_options(spiffe("alice")),
        )
        opened.append(channel)
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        pid = await _pid_or_reason(stub)
        assert isinstance(pid, int), pid
        by_pid.setdefault(pid, stub)
        if len(by_pid) == 2:
            break
    return by_pid


async def _reason_of(call: object) -> str:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        return gateway_reason(err)
    return "OK"


async def test_another_peer_cannot_read_or_cancel_a_task_on_either_worker(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(
        pki, tmp_path, [grant("bob", ["worker.pid", "job.hang"]), grant("carol", ["worker.pid"])]
    )
    opened: list[grpc.aio.Channel] = []
    try:
        address = agent.start()
        try:
            bobs = await _stubs_per_worker(pki, address, "bob", opened)
            carols = await _stubs_per_worker(pki, address, "carol", opened)
            workers = worker_pids(agent)
            assert sorted(bobs) == sorted(carols) == sorted(workers)
            request = data_request("job.hang", {"tag": "x"})
            request.configuration.return_immediately = True
            task = (await bobs[workers[0]].SendMessage(request, metadata=V1, timeout=20)).task

            for pid in workers:  # carol, on the runner and on the other worker
                carol = carols[pid]
                get = carol.GetTask(a2a_pb2.GetTaskRequest(id=task.id), metadata=V1, timeout=20)
                assert await _reason_of(get) == "TASK_NOT_FOUND"
                cancel = carol.CancelTask(
                    a2a_pb2.CancelTaskRequest(id=task.id), metadata=V1, timeout=20
                )
                assert await _reason_of(cancel) == "TASK_NOT_FOUND"
            for pid in workers:  # bob's task runs on, seen from both workers
                seen = await bobs[pid].GetTask(
                    a2a_pb2.GetTaskRequest(id=task.id), metadata=V1, timeout=20
                )
                assert seen.status.state in (
                    a2a_pb2.TASK_STATE_SUBMITTED,
                    a2a_pb2.TASK_STATE_WORKING,
                )
            # The owner cancels it from the worker that does not run it.
            canceled = await bobs[workers[1]].CancelTask(
                a2a_pb2.CancelTaskRequest(id=task.id), metadata=V1, timeout=30
            )
            assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
        finally:
            for channel in opened:
                await channel.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    rows = audit_rows(tmp_path / "audit.sqlite")
    carol_refusals = [r for r in rows if r.peer_id == spiffe("carol") and r.decision == "refuse"]
    assert [r.reason for r in carol_refusals] == ["TASK_NOT_FOUND"] * 4
    hang = [r for r in rows if r.capability == "job.hang"]
    assert [(r.decision, r.reason) for r in hang] == [("allow", "CANCELLED")]
    assert hang[0].detail == f"A2A CancelTask by {spiffe('bob')}"


async def test_a_task_running_on_one_worker_holds_the_peers_place_on_the_other(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(
        pki, tmp_path, [{**grant("bob", ["worker.pid", "job.hang"]), "max_in_flight": 1}]
    )
    opened: list[grpc.aio.Channel] = []
    try:
        address = agent.start()
        try:
            bobs = await _stubs_per_worker(pki, address, "bob", opened)
            workers = worker_pids(agent)
            assert sorted(bobs) == sorted(workers)
            runner, other = bobs[workers[0]], bobs[workers[1]]
            request = data_request("job.hang", {"tag": "hold"})
            request.configuration.return_immediately = True
            task = (await runner.SendMessage(request, metadata=V1, timeout=20)).task

            assert await _pid_or_reason(other) == "CONCURRENCY_LIMITED"
            assert await _pid_or_reason(runner) == "CONCURRENCY_LIMITED"
            second = data_request("job.hang", {"tag": "second"})
            second.configuration.return_immediately = True
            assert await _reason_of(other.SendMessage(second, metadata=V1, timeout=20)) == (
                "CONCURRENCY_LIMITED"
            )
            subscribe = other.SubscribeToTask(
                a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=20
            )
            try:
                await subscribe.read()
                sub_reason = "OK"
            except grpc.aio.AioRpcError as err:
                sub_reason = gateway_reason(err)
            assert sub_reason == "CONCURRENCY_LIMITED"  # a subscription needs a place
            # A poll of its own task needs none, on either worker.
            for stub in (runner, other):
                seen = await stub.GetTask(
                    a2a_pb2.GetTaskRequest(id=task.id), metadata=V1, timeout=20
                )
                assert seen.id == task.id
            canceled = await other.CancelTask(
                a2a_pb2.CancelTaskRequest(id=task.id), metadata=V1, timeout=30
            )
            assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
            # Its place is given back: both workers admit bob again.
            assert await _pid_or_reason(other) == workers[1]
            assert await _pid_or_reason(runner) == workers[0]
        finally:
            for channel in opened:
                await channel.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()


async def test_a_burst_over_a2a_is_shared_by_both_workers(pki: Pki, tmp_path: Path) -> None:
    burst = 12
    agent = _agent(
        pki,
        tmp_path,
        [{**grant("bob", ["worker.pid"]), "max_calls_per_second": 0.0001, "burst": burst}],
    )
    opened: list[grpc.aio.Channel] = []
    try:
        address = agent.start()
        try:
            by_pid: dict[int, a2a_pb2_grpc.A2AServiceStub] = {}
            found = 0
            for _ in range(burst):
                channel = grpc.aio.secure_channel(
                    address,
                    pki.material("bob").channel_credentials(),
                    options=channel_options(spiffe("alice")),
                )
                opened.append(channel)
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                pid = await _pid_or_reason(stub)
                assert isinstance(pid, int), pid
                found += 1
                by_pid.setdefault(pid, stub)
                if len(by_pid) == 2:
                    break
            workers = worker_pids(agent)
            assert sorted(by_pid) == sorted(workers)
            after = [await _pid_or_reason(by_pid[workers[n % 2]]) for n in range(2 * burst)]
        finally:
            for channel in opened:
                await channel.close()
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    admitted = [o for o in after if isinstance(o, int)]
    assert found + len(admitted) == burst
    assert set(after) - set(workers) == {"RATE_LIMITED"}
