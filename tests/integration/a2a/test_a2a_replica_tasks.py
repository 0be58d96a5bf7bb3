"""Background tasks on two replicas of one agent id sharing PostgreSQL.

A task started on one replica is seen running from the other, and a
CancelTask sent to the other cancels it where it runs (a recorded request
that replica carries out); a replica's tasks are never taken for orphans
while its lease is live.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.agent import Agent
from gateway.audit import query_records
from gateway.audit.filter import AuditFilter
from gateway.storage import location, open_audit_reader
from tests.a2a_support import A2APeer, data_request
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.task_capabilities import TaskGate


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def replicas(
    pki: Pki, tmp_path: Path, pg_dsn: str, gate: TaskGate
) -> AsyncIterator[list[Agent]]:
    policy = write_policy(
        tmp_path / "policy.toml", [grant("bob", ["job.run"]), grant("carol", ["job.run"])]
    )
    agents = []
    for n in range(2):
        base = tmp_path / f"replica-{n}"
        base.mkdir()
        config = agent_config(
            pki, base, "alice", policy, stores={"audit_db": pg_dsn, "state_db": pg_dsn}
        )
        registry = standard_registry(WriteCounter(), base / "kv")
        for cap in gate.capabilities():
            registry.register(cap)
        agents.append(await started(config, registry))
    yield agents
    for agent in agents:
        await agent.stop()


async def test_cancel_on_one_replica_cancels_the_task_running_on_the_other(
    pki: Pki, replicas: list[Agent], gate: TaskGate, pg_dsn: str
) -> None:
    one, two = replicas
    request = data_request("job.run", {"tag": "r"})
    request.configuration.return_immediately = True
    async with A2APeer(pki, one, "bob") as bob_one:
        task = await bob_one.send(request)
    await asyncio.wait_for(gate.started.wait(), 10)
    async with A2APeer(pki, two, "bob") as bob, A2APeer(pki, two, "carol") as carol:
        seen = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
        assert seen.status.state in (a2a_pb2.TASK_STATE_SUBMITTED, a2a_pb2.TASK_STATE_WORKING)
        with pytest.raises(a2a_errors.TaskNotFoundError):
            await carol.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
        canceled = await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED
    assert gate.cancelled.is_set()
    for agent in replicas:
        await agent.audit.flush()
    ran = [
        r
        for r in query_records(
            open_audit_reader(location(pg_dsn)), AuditFilter(agent=one.config.id)
        )
        if r.capability
    ]
    assert [(r.reason, r.detail) for r in ran] == [
        ("CANCELLED", f"A2A CancelTask by {spiffe('bob')}")
    ]
    # The replica that answered never took the live task for an orphan.
    assert two.a2a_runs.running(task.id) is None
