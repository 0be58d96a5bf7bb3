"""Probe: an upstream that gives two callers the same task id cannot join their tasks.

bob fronts a scripted gRPC A2A upstream that answers every call with a task of
one fixed id and context (a hostile id: a newline, an escape sequence). alice
and carol each call ``legacy.search`` through bob over A2A.

Holds (no defect found): bob's task ids and context ids are its own (uuid4),
never the upstream's, so the two calls are two tasks of bob's; carol gets
``TASK_NOT_FOUND`` for alice's task id and for the upstream's id (GetTask,
CancelTask) and ListTasks shows her only her own; the upstream's id appears
nowhere in bob's audit log or in what a caller receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import json_format

from tests.helpers.a2a_grpc import V1, A2APeer, data_request, error_infos
from tests.helpers.a2a_hostile_upstream import scripted_grpc_upstream
from tests.helpers.agents import Pki, audit_rows, spiffe
from tests.helpers.fronting import LEGACY, fronted

SHARED_TASK = "shared-task\n\x1b[31mEVIL"
SHARED_CONTEXT = "shared-context"


@dataclass
class SameIdUpstream(a2a_pb2_grpc.A2AServiceServicer):
    """Every SendMessage: a completed task with the same id, context and output."""

    sent: int = 0
    asked: list[str] = field(default_factory=list)

    def _task(self) -> a2a_pb2.Task:
        task = a2a_pb2.Task(id=SHARED_TASK, context_id=SHARED_CONTEXT)
        task.status.state = a2a_pb2.TASK_STATE_COMPLETED
        part = task.artifacts.add(artifact_id="a").parts.add()
        json_format.ParseDict({"hits": [f"answer {self.sent}"]}, part.data)
        return task

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.SendMessageResponse:
        self.sent += 1
        return a2a_pb2.SendMessageResponse(task=self._task())

    async def GetTask(
        self, request: a2a_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        self.asked.append(request.id)
        return self._task()

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        self.asked.append(request.id)
        return self._task()


async def _not_found(call: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert ("a2agw.v1", "TASK_NOT_FOUND") in error_infos(info.value)


async def test_two_callers_given_one_upstream_task_id_get_two_tasks_of_their_own(
    pki: Pki, tmp_path: Path
) -> None:
    fake = SameIdUpstream()
    async with scripted_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob:
            async with A2APeer(pki, bob, "alice") as alice, A2APeer(pki, bob, "carol") as carol:
                a = await alice.send(data_request("legacy.search", {"query": "q"}))
                c = await carol.send(data_request("legacy.search", {"query": "q"}))
                assert a.status.state == c.status.state == a2a_pb2.TASK_STATE_COMPLETED
                assert len({a.id, c.id, SHARED_TASK}) == 3
                assert SHARED_CONTEXT not in (a.context_id, c.context_id)
                assert SHARED_TASK not in str(a) + str(c)
                for task_id in (a.id, SHARED_TASK):
                    await _not_found(
                        carol.stub.GetTask(a2a_pb2.GetTaskRequest(id=task_id), metadata=V1)
                    )
                    await _not_found(
                        carol.stub.CancelTask(a2a_pb2.CancelTaskRequest(id=task_id), metadata=V1)
                    )
                listed = await carol.stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=V1)
                assert [t.id for t in listed.tasks] == [c.id]
                mine = await alice.stub.GetTask(a2a_pb2.GetTaskRequest(id=a.id), metadata=V1)
                assert json_format.MessageToDict(mine.artifacts[0].parts[0].data) == {
                    "hits": ["answer 1"]
                }
            await bob.audit.flush()
            rows = audit_rows(bob.config.audit_db)
            db = Path(bob.config.audit_db)
            audit_bytes = b"".join(f.read_bytes() for f in db.parent.glob(db.name + "*"))
    assert fake.sent == 2 and fake.asked == []  # nothing of carol's reached the upstream
    assert b"shared-task" not in audit_bytes
    assert all(SHARED_TASK not in repr(r) for r in rows)
    callers = {(r.peer_id, r.capability, r.reason) for r in rows if r.capability}
    assert (spiffe("alice"), "legacy.search", "OK") in callers
    assert (spiffe("carol"), "legacy.search", "OK") in callers
