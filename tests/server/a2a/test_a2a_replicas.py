"""Two replicas of one agent id sharing PostgreSQL share their A2A tasks, scoped by owner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from gateway.audit import query_records
from gateway.audit.filter import AuditFilter
from gateway.runtime.agent import Agent
from gateway.storage import location, open_audit_reader
from tests.helpers.a2a_grpc import A2APeer, data_request, error_infos, output_of
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

UNKNOWN = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
async def replicas(pki: Pki, tmp_path: Path, pg_dsn: str) -> AsyncIterator[list[Agent]]:
    """alice twice: same identity, policy and database; own port and state_dir each."""
    policy = write_policy(
        tmp_path / "policy.toml", [grant("bob", ["text.echo"]), grant("carol", ["text.echo"])]
    )
    agents = []
    for n in range(2):
        base = tmp_path / f"replica-{n}"
        base.mkdir()
        config = agent_config(
            pki, base, "alice", policy, stores={"audit_db": pg_dsn, "state_db": pg_dsn}
        )
        agents.append(await started(config, standard_registry(WriteCounter(), base / "kv")))
    yield agents
    for agent in agents:
        await agent.stop()


async def _not_found(peer: A2APeer, task_id: str) -> tuple[object, ...]:
    with pytest.raises(a2a_errors.TaskNotFoundError) as info:
        await peer.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
    rpc = info.value.__cause__
    assert isinstance(rpc, grpc.aio.AioRpcError)
    return rpc.code(), rpc.details(), error_infos(rpc)


async def test_a_task_answered_by_one_replica_is_the_owners_on_the_other(
    pki: Pki, replicas: list[Agent], pg_dsn: str
) -> None:
    one, two = replicas
    async with A2APeer(pki, one, "bob") as bob_one:
        task = await bob_one.send(data_request("text.echo", {"text": "shared"}))
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    await one.a2a_tasks.flush()  # visible elsewhere once its batch commits

    async with A2APeer(pki, two, "bob") as bob, A2APeer(pki, two, "carol") as carol:
        got = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
        assert (got.id, got.context_id) == (task.id, task.context_id)
        assert got.status.state == a2a_pb2.TASK_STATE_COMPLETED
        assert output_of(got) == {"text": "shared"}
        listed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest(include_artifacts=True))
        assert [t.id for t in listed.tasks] == [task.id] and listed.total_size == 1
        assert output_of(listed.tasks[0]) == {"text": "shared"}
        with pytest.raises(a2a_errors.TaskNotCancelableError):  # found: it has finished
            await bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))

        theirs, unknown = await _not_found(carol, task.id), await _not_found(carol, UNKNOWN)
        assert theirs == unknown and theirs[0] is grpc.StatusCode.NOT_FOUND
        with pytest.raises(a2a_errors.TaskNotFoundError):
            await carol.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
        carols = await carol.client.list_tasks(a2a_pb2.ListTasksRequest())
        assert list(carols.tasks) == [] and carols.total_size == 0

    for agent in replicas:
        await agent.audit.flush()
    refusals = query_records(
        open_audit_reader(location(pg_dsn)), AuditFilter(agent=one.config.id, refusals_only=True)
    )
    assert [(r.peer_id, r.reason, r.detail) for r in refusals] == [
        (spiffe("bob"), "TASK_NOT_CANCELABLE", "A2A CancelTask"),
        (spiffe("carol"), "TASK_NOT_FOUND", "A2A GetTask"),
        (spiffe("carol"), "TASK_NOT_FOUND", "A2A GetTask"),
        (spiffe("carol"), "TASK_NOT_FOUND", "A2A CancelTask"),
    ]
