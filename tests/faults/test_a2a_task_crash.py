"""An A2A task running when its agent process is SIGKILLed is FAILED after restart.

The agent is ``a2a-gateway serve`` in its own process; the caller is the
a2a-sdk gRPC client in another (streaming, then ``return_immediately``).
Nothing resumes the task: its input is not kept and a write could run twice,
so the restarted agent answers it ``TASK_STATE_FAILED`` / ``TASK_INTERRUPTED``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc

from gateway.transport.tls import channel_options
from tests.helpers.a2a_grpc import V1
from tests.helpers.agent_process import REPO, AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, grant, spiffe, write_policy


def _sdk_client_process(pki: Pki, address: str) -> dict[str, object]:
    script = REPO / "tests" / "helpers" / "a2a_stream_client_script.py"
    args = [spiffe("alice"), *(str(pki.dir / f) for f in ("ca.pem", "bob.pem", "bob.key"))]
    done = subprocess.run(
        [sys.executable, str(script), address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


async def _state(pki: Pki, address: str, task_id: str) -> a2a_pb2.Task:
    credentials = pki.material("bob").channel_credentials()
    async with grpc.aio.secure_channel(
        address, credentials, options=channel_options(spiffe("alice"))
    ) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        task: a2a_pb2.Task = await stub.GetTask(
            a2a_pb2.GetTaskRequest(id=task_id), metadata=V1, timeout=10
        )
        return task


async def test_a_task_running_when_its_agent_was_killed_is_failed_after_restart(
    pki: Pki, tmp_path: Path
) -> None:
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo", "job.hang"])]),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
        modules=("tests.helpers.task_capabilities",),
    )
    agent = AgentProcess(config)
    try:
        address = agent.start()
        answer = _sdk_client_process(pki, address)
        assert answer["stream"] == [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_WORKING",
            'artifact:{"text": "hi"}',
            "status:TASK_STATE_COMPLETED",
        ]
        assert answer["hang_state"] == "TASK_STATE_SUBMITTED"
        task_id = str(answer["hang_task"])
        for _ in range(200):  # bounded: 10 s
            if (await _state(pki, address, task_id)).status.state == a2a_pb2.TASK_STATE_WORKING:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the background task never started")
        agent.kill()

        agent = AgentProcess(config)
        address = agent.start()
        task = await _state(pki, address, task_id)
        assert task.status.state == a2a_pb2.TASK_STATE_FAILED
        assert task.metadata["a2agw.reason"] == "TASK_INTERRUPTED"
        assert "not resumed" in task.status.message.parts[0].text
        assert agent.terminate() == 0
    finally:
        agent.ensure_stopped()
    echo = [r.reason for r in audit_rows(tmp_path / "audit.sqlite") if r.capability == "text.echo"]
    assert echo == ["OK"]
