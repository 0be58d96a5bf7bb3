"""``workers = 2``: a SubscribeToTask on one worker follows a task the other worker runs.

The agent runs as ``serve`` (a supervisor and two worker processes on one
SQLite state dir). Separate channels are separate connections, which the
kernel spreads over the workers; ``worker.pid`` says which worker a channel
reaches. bob starts ``job.hang`` on worker A, subscribes on worker B (which
follows the task's row), and cancels it on B (a cancel request A carries
out): B's stream is the task, then the terminal CANCELED status, and ends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import json_format

from gateway.transport.tls import channel_options
from tests.helpers.a2a_grpc import V1, data_request
from tests.helpers.agent_process import AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy

pytestmark = pytest.mark.slow

MAX_CHANNELS = 32  # connections opened to find both workers (a bound, never asserted)


def _agent(pki: Pki, tmp_path: Path) -> AgentProcess:
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["worker.pid", "job.hang"])]),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
        modules=("tests.helpers.task_capabilities", "tests.helpers.worker_pid"),
    )
    config.write_text("workers = 2\n" + config.read_text())
    return AgentProcess(config)


async def _pid(stub: a2a_pb2_grpc.A2AServiceStub) -> int:
    answer = await stub.SendMessage(data_request("worker.pid", {}), metadata=V1, timeout=20)
    data = answer.task.artifacts[0].parts[0].data
    return int(json_format.MessageToDict(data)["pid"])


async def _one_stub_per_worker(
    pki: Pki, address: str
) -> tuple[list[a2a_pb2_grpc.A2AServiceStub], list[grpc.aio.Channel]]:
    by_pid: dict[int, a2a_pb2_grpc.A2AServiceStub] = {}
    opened: list[grpc.aio.Channel] = []
    for _ in range(MAX_CHANNELS):
        channel = grpc.aio.secure_channel(
            address,
            pki.material("bob").channel_credentials(),
            options=channel_options(spiffe("alice")),
        )
        opened.append(channel)
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        by_pid.setdefault(await _pid(stub), stub)
        if len(by_pid) == 2:
            break
    return list(by_pid.values()), opened


async def test_a_subscription_on_one_worker_follows_the_task_running_on_the_other(
    pki: Pki, tmp_path: Path
) -> None:
    agent = _agent(pki, tmp_path)
    address = agent.start()
    channels: list[grpc.aio.Channel] = []
    try:
        stubs, channels = await _one_stub_per_worker(pki, address)
        assert len(stubs) == 2, "the kernel never spread the connections over both workers"
        runner, follower = stubs
        request = data_request("job.hang", {"tag": "w"})
        request.configuration.return_immediately = True
        task = (await runner.SendMessage(request, metadata=V1, timeout=20)).task

        stream = follower.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=task.id), metadata=V1, timeout=60
        )
        first = await stream.read()
        assert first.task.id == task.id
        assert first.task.status.state in (
            a2a_pb2.TASK_STATE_SUBMITTED,
            a2a_pb2.TASK_STATE_WORKING,
        )
        canceled = await follower.CancelTask(
            a2a_pb2.CancelTaskRequest(id=task.id), metadata=V1, timeout=30
        )
        assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
        rest = []
        while (event := await asyncio.wait_for(stream.read(), 30)) is not grpc.aio.EOF:
            rest.append(event)
        assert await stream.code() is grpc.StatusCode.OK
    finally:
        for channel in channels:
            await channel.close()
        agent.terminate()
    states = [e.status_update.status.state for e in rest]
    assert states[-1] == a2a_pb2.TASK_STATE_CANCELED
    assert set(states[:-1]) <= {a2a_pb2.TASK_STATE_WORKING}  # a WORKING change, if it was seen
    assert rest[-1].status_update.status.message.metadata["a2agw.reason"] == "CANCELLED"
