"""A2A test helpers: a real a2a-sdk client over our mTLS channel, messages, reasons."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import grpc
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a import public_card
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome
from gateway.transport.status import from_rpc_error
from tests.helpers.agents import (
    Pki,
    audit_rows,
    raw_channel,
)

V1 = (("a2a-version", "1.0"),)


def sdk_client(
    channel: grpc.aio.Channel, agent: Agent, *, streaming: bool = False, polling: bool = False
) -> Client:
    """An a2a-sdk client on ``channel`` (gRPC binding; blocking SendMessage by default).

    ``streaming``: send_message is SendStreamingMessage and ``subscribe`` works;
    ``polling``: SendMessage asks ``return_immediately``.
    """
    config = ClientConfig(
        streaming=streaming,
        polling=polling,
        supported_protocol_bindings=["GRPC"],
        grpc_channel_factory=lambda _: channel,
    )
    return ClientFactory(config).create(public_card(agent.config.id, agent.address))


class A2APeer:
    """One caller's channel to an agent, with an SDK client and a raw stub on it."""

    def __init__(self, pki: Pki, agent: Agent, caller: str) -> None:
        self.channel = raw_channel(pki, agent, caller)
        self.client = sdk_client(self.channel, agent)
        self.stub = a2a_pb2_grpc.A2AServiceStub(self.channel)

    async def send(self, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.Task:
        """SendMessage through the SDK client; the task it answers with."""
        events = [event async for event in self.client.send_message(request)]
        assert len(events) == 1 and events[0].WhichOneof("payload") == "task"
        return events[0].task

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> A2APeer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def data_request(
    capability: str,
    payload: Any,
    *,
    message_id: str | None = None,
    idempotency_key: str = "",
    extra_parts: int = 0,
) -> a2a_pb2.SendMessageRequest:
    """A SendMessage with one ``data`` part (plus ``extra_parts`` more)."""
    message = _message(capability, message_id, idempotency_key)
    for _ in range(1 + extra_parts):
        json_format.ParseDict(payload, message.parts.add().data)
    return a2a_pb2.SendMessageRequest(message=message)


def poisoned(capability: str, blob_bytes: int) -> a2a_pb2.SendMessageRequest:
    """A data part of about ``blob_bytes`` whose last field is NaN: decoding it fails.

    Any answer but INVALID_REQUEST ("the data part holds a number JSON cannot
    carry") proves the part was never decoded.
    """
    request = data_request(capability, {"note": "n"})
    data = request.message.parts[0].data.struct_value
    data.update({"blob": ["x" * 1000] * (blob_bytes // 1000)})
    data.fields["zz"].number_value = math.nan
    return request


def raw_request(
    capability: str,
    raw: bytes,
    *,
    media_type: str = "application/json",
    message_id: str | None = None,
) -> a2a_pb2.SendMessageRequest:
    """A SendMessage with one ``raw`` part."""
    message = _message(capability, message_id, "")
    message.parts.add(raw=raw, media_type=media_type)
    return a2a_pb2.SendMessageRequest(message=message)


def _message(capability: str, message_id: str | None, idempotency_key: str) -> a2a_pb2.Message:
    message = a2a_pb2.Message(message_id=message_id or str(uuid.uuid4()), role=a2a_pb2.ROLE_USER)
    if capability:
        message.metadata["a2agw.capability"] = capability
    if idempotency_key:
        message.metadata["a2agw.idempotency_key"] = idempotency_key
    return message


def output_of(task: a2a_pb2.Task) -> Any:
    """The capability's output: the first part of the task's one artifact."""
    assert len(task.artifacts) == 1
    return json_format.MessageToDict(task.artifacts[0].parts[0].data)


def gateway_reason(err: BaseException) -> str:
    """Our reason code from an SDK client error (or a raw AioRpcError)."""
    rpc = err if isinstance(err, grpc.RpcError) else err.__cause__
    assert isinstance(rpc, grpc.RpcError), f"{type(err).__name__}: {err}"
    return from_rpc_error(rpc).reason


def error_infos(err: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    """(domain, reason) of every ErrorInfo in the error's rich status, in order."""
    status = rpc_status.from_call(err)
    assert status is not None
    found = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        assert detail.Unpack(info)
        found.append((info.domain, info.reason))
    return found


def a2a_task(
    task_id: str,
    owner: str,
    capability: str,
    *,
    state: TaskOutcome = TaskOutcome.WORKING,
    context_id: str = "ctx",
    served_version: str = "1.0.0",
    output: bytes = b"",
    evidence_sha256: str = "",
    remembered: bool = False,
    reason: str = "",
    message: str = "",
    created_ms: int = 0,
    updated_ms: int | None = None,
) -> A2ATask:
    """A task row as the A2A task store keeps it (``updated_ms`` defaults to ``created_ms``)."""
    return A2ATask(
        task_id=task_id,
        owner=owner,
        context_id=context_id,
        state=state,
        capability=capability,
        served_version=served_version,
        output=output,
        evidence_sha256=evidence_sha256,
        remembered=remembered,
        reason=reason,
        message=message,
        created_ms=created_ms,
        updated_ms=created_ms if updated_ms is None else updated_ms,
    )


async def last_record(agent: Agent) -> AuditRecord:
    """The newest record of ``agent``'s audit log (after a flush)."""
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)[-1]


def summary(event: a2a_pb2.StreamResponse) -> str:
    """``task:SUBMITTED``, ``status:WORKING[:text]``, ``artifact:<id suffix>``."""
    kind = event.WhichOneof("payload")
    if kind == "task":
        return f"task:{task_state_name(event.task.status.state)}"
    if kind == "status_update":
        status = event.status_update.status
        text = status.message.parts[0].text if status.message.parts else ""
        return f"status:{task_state_name(status.state)}" + (f":{text}" if text else "")
    assert kind == "artifact_update"
    return "artifact:" + event.artifact_update.artifact.artifact_id.rsplit("-", 1)[-1]


def task_state_name(state: int) -> str:
    return a2a_pb2.TaskState.Name(state).removeprefix("TASK_STATE_")


async def poll_until(peer: A2APeer, task_id: str, state: int) -> a2a_pb2.Task:
    for _ in range(400):  # bounded: 20 s
        task = await peer.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        if task.status.state == state:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {task_state_name(state)}")
