"""Unreadable client certificates on every A2A method: UNAUTHENTICATED, audited once.

The A2A servicer runs the same pipeline ``identity`` check as Invoke and
Describe, so a CA-signed certificate the parser cannot read (the classes that
pass BoringSSL's handshake) is refused the same way on each of the eleven
methods, never UNKNOWN, never the parser's text, and no side effect.
"""

from __future__ import annotations

import grpc
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import empty_pb2

from gateway.runtime.agent import Agent
from gateway.transport.tls import channel_options
from tests.helpers.a2a_grpc import V1, data_request
from tests.helpers.agents import Pki, WriteCounter, audit_rows
from tests.helpers.forged_certs import (
    MALFORMED_EXAMPLES,
    PARSER_WORDS,
    REACH_THE_GATEWAY,
    material_raw,
)

_UNARY_METHODS: dict[str, object] = {
    "SendMessage": data_request("notes.write", {"note": "x"}),
    "GetTask": a2a_pb2.GetTaskRequest(id="t-1"),
    "ListTasks": a2a_pb2.ListTasksRequest(),
    "CancelTask": a2a_pb2.CancelTaskRequest(id="t-1"),
    "GetExtendedAgentCard": a2a_pb2.GetExtendedAgentCardRequest(),
    "CreateTaskPushNotificationConfig": a2a_pb2.TaskPushNotificationConfig(task_id="t-1"),
    "GetTaskPushNotificationConfig": a2a_pb2.GetTaskPushNotificationConfigRequest(task_id="t-1"),
    "ListTaskPushNotificationConfigs": a2a_pb2.ListTaskPushNotificationConfigsRequest(
        task_id="t-1"
    ),
    "DeleteTaskPushNotificationConfig": a2a_pb2.DeleteTaskPushNotificationConfigRequest(
        task_id="t-1"
    ),
}
_STREAMING_METHODS: dict[str, object] = {
    "SendStreamingMessage": data_request("notes.write", {"note": "x"}),
    "SubscribeToTask": a2a_pb2.SubscribeToTaskRequest(id="t-1"),
}


async def _call(stub: a2a_pb2_grpc.A2AServiceStub, method: str) -> grpc.aio.AioRpcError:
    try:
        if method in _STREAMING_METHODS:
            async for _ in getattr(stub, method)(
                _STREAMING_METHODS[method], metadata=V1, timeout=10
            ):
                pass
        else:
            answer = await getattr(stub, method)(_UNARY_METHODS[method], metadata=V1, timeout=10)
            assert not isinstance(answer, empty_pb2.Empty | a2a_pb2.Task)
    except grpc.aio.AioRpcError as err:
        return err
    raise AssertionError(f"{method} answered a forged certificate")


def test_the_table_covers_every_a2a_method() -> None:
    service = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
    assert {m.name for m in service.methods} == set(_UNARY_METHODS) | set(_STREAMING_METHODS)


@pytest.mark.parametrize("method", sorted({*_UNARY_METHODS, *_STREAMING_METHODS}))
@pytest.mark.parametrize("name", REACH_THE_GATEWAY[:3])
async def test_every_a2a_method_refuses_an_unreadable_certificate(
    pki: Pki, alice: Agent, counter: WriteCounter, name: str, method: str
) -> None:
    material = material_raw(pki.ca, MALFORMED_EXAMPLES[name])
    before = len(audit_rows(alice.config.audit_db))

    async with grpc.aio.secure_channel(
        alice.address, material.channel_credentials(), options=channel_options(alice.config.id)
    ) as channel:
        err = await _call(a2a_pb2_grpc.A2AServiceStub(channel), method)

    assert err.code() is grpc.StatusCode.UNAUTHENTICATED
    assert not any(word in (err.details() or "") for word in PARSER_WORDS), err.details()
    rows = audit_rows(alice.config.audit_db)[before:]
    assert [(r.decision, r.reason, r.peer_id) for r in rows] == [("refuse", "UNAUTHENTICATED", "")]
    assert counter.calls == 0
