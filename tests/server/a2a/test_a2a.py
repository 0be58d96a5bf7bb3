"""A2A 1.0 served by every agent, driven by the real a2a-sdk client over mTLS.

Same policy, payload cap, replay protection and audit as Invoke; refusals are
gRPC errors with our reason codes; a write capability never runs on a refusal.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capabilities.context import CallContext
from capabilities.registry import capability
from gateway.runtime.agent import Agent
from gateway.server.a2a import CONTRACTS_EXTENSION_URI
from tests.helpers.a2a_grpc import (
    A2APeer,
    data_request,
    gateway_reason,
    last_record,
    output_of,
    raw_request,
)
from tests.helpers.agents import (
    NoteInput,
    NoteOutput,
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    raw_channel,
    standard_registry,
    started,
    write_policy,
)

# --- the card ---------------------------------------------------------------


async def test_each_caller_gets_a_card_of_its_own_grant(
    alice: Agent, bob: A2APeer, carol: A2APeer
) -> None:
    request = a2a_pb2.GetExtendedAgentCardRequest()
    bobs = await bob.client.get_extended_agent_card(request)
    carols = await carol.client.get_extended_agent_card(request)

    assert [s.id for s in bobs.skills] == [
        "kv.get",
        "kv.put",
        "notes.write",
        "text.echo",
        "text.search",
    ]
    # carol's grant names notes.write too, but her max_risk is read.
    assert [s.id for s in carols.skills] == ["text.echo"]
    echo = carols.skills[0]
    assert echo.name == "text.echo" and echo.description
    assert set(echo.tags) == {"risk:read", "idempotent"}
    assert json.loads(echo.examples[0]) == {"input": {"text": "hi"}, "output": {"text": "hi"}}
    put = next(s for s in bobs.skills if s.id == "kv.put")
    assert "risk:write" in put.tags

    for card, cap in ((bobs, 1024), (carols, 65536)):
        assert card.supported_interfaces[0].protocol_binding == "GRPC"
        assert card.supported_interfaces[0].protocol_version == "1.0"
        assert card.supported_interfaces[0].url == alice.address
        assert card.capabilities.streaming is True
        assert card.capabilities.push_notifications is False
        assert card.capabilities.extended_agent_card is True
        assert card.security_schemes["mtls"].HasField("mtls_security_scheme")
        extension = card.capabilities.extensions[0]
        assert extension.uri == CONTRACTS_EXTENSION_URI
        params = json_format.MessageToDict(extension.params)
        assert params["max_payload_bytes"] == cap
        assert params["grant_expires_at"]
        assert set(params["capabilities"]) == {s.id for s in card.skills}
    search = json_format.MessageToDict(bobs.capabilities.extensions[0].params)["capabilities"][
        "text.search"
    ]
    assert search["version"] == "1.0.0" and search["risk"] == "read"
    assert search["input_schema"]["properties"]["limit"]["type"] == "integer"
    assert search["output_schema"]["type"] == "object"
    assert search["timeout_seconds"] > 0


async def test_a_peer_without_a_grant_gets_no_card_and_is_audited(pki: Pki, alice: Agent) -> None:
    async with A2APeer(pki, alice, "mallory") as mallory:
        with pytest.raises(a2a_errors.A2AError) as info:
            await mallory.client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
    assert gateway_reason(info.value) == "UNKNOWN_PEER"
    record = await last_record(alice)
    assert (record.decision, record.reason, record.detail) == (
        "refuse",
        "UNKNOWN_PEER",
        "A2A GetExtendedAgentCard",
    )


async def test_health_lists_the_a2a_service(pki: Pki, alice: Agent) -> None:
    async with raw_channel(pki, alice, "bob") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(service="lf.a2a.v1.A2AService"))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


# --- SendMessage ------------------------------------------------------------


async def test_data_part_with_an_integer_field(alice: Agent, bob: A2APeer) -> None:
    request = data_request("text.search@^1", {"query": "audit", "limit": 1})
    task = await bob.send(request)

    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert output_of(task) == {"items": [{"id": "doc-3", "title": "Audit logs", "score": 1}]}
    meta = json_format.MessageToDict(task.artifacts[0].metadata)
    assert meta["a2agw.served_version"] == "1.0.0"
    assert meta["a2agw.replayed"] is False
    assert len(meta["a2agw.evidence_sha256"]) == 64
    record = await last_record(alice)
    # The payload the pipeline saw: compact JSON, sorted keys, limit an integer again.
    payload = b'{"limit":1,"query":"audit"}'
    assert (record.decision, record.reason, record.capability) == ("allow", "OK", "text.search")
    assert record.request_id == request.message.message_id
    assert record.task_id == task.id
    assert record.payload_sha256 == hashlib.sha256(payload).hexdigest()


async def test_raw_part_bytes_are_the_payload(alice: Agent, bob: A2APeer) -> None:
    raw = b'{ "text" : "raw bytes" }'
    task = await bob.send(raw_request("text.echo", raw))
    assert output_of(task) == {"text": "raw bytes"}
    record = await last_record(alice)
    assert record.payload_sha256 == hashlib.sha256(raw).hexdigest()
    assert record.payload_size == len(raw)


async def test_write_capability_and_idempotency_key(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    first = await bob.send(data_request("notes.write", {"note": "n"}, idempotency_key="k-1"))
    again = await bob.send(data_request("notes.write", {"note": "n"}, idempotency_key="k-1"))
    assert counter.calls == 1
    assert output_of(first) == output_of(again) == {"stored": 1}
    assert json_format.MessageToDict(again.artifacts[0].metadata)["a2agw.replayed"] is True
    assert first.id != again.id


async def test_a_failure_after_admission_is_a_failed_task(pki: Pki, tmp_path: Path) -> None:
    counter = WriteCounter()
    registry = standard_registry(counter, tmp_path / "alice-state")

    @capability("notes.fail", "1.0.0", risk="write", timeout=2.0)
    async def fail(inp: NoteInput, ctx: CallContext) -> NoteOutput:
        """Always raises."""
        raise RuntimeError("kaboom")

    registry.register(fail)
    policy = write_policy(tmp_path / "p.toml", [grant("bob", ["notes.fail"])])
    agent = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    try:
        async with A2APeer(pki, agent, "bob") as bob:
            task = await bob.send(data_request("notes.fail", {"note": "x"}))
            assert task.status.state == a2a_pb2.TASK_STATE_FAILED
            assert task.status.message.metadata["a2agw.reason"] == "CAPABILITY_FAILED"
            assert "kaboom" not in task.status.message.parts[0].text
            assert not task.artifacts
            again = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
            assert again.status.state == a2a_pb2.TASK_STATE_FAILED
        reasons = [(r.decision, r.reason) for r in audit_rows(agent.config.audit_db)]
        assert reasons[-2:] == [("allow", "ADMITTED"), ("allow", "CAPABILITY_FAILED")]
    finally:
        await agent.stop()


# --- refusals before dispatch -------------------------------------------------

REFUSALS = [
    (
        "mallory",
        data_request("notes.write", {"note": "x"}),
        "UNKNOWN_PEER",
        grpc.StatusCode.PERMISSION_DENIED,
    ),
    (
        "carol",
        data_request("text.search", {"query": "q"}),
        "CAPABILITY_NOT_GRANTED",
        grpc.StatusCode.PERMISSION_DENIED,
    ),
    (
        "carol",
        data_request("notes.write", {"note": "x"}),
        "RISK_NOT_GRANTED",
        grpc.StatusCode.PERMISSION_DENIED,
    ),
    (
        "dave",
        data_request("text.echo", {"text": "x"}),
        "GRANT_EXPIRED",
        grpc.StatusCode.PERMISSION_DENIED,
    ),
    (
        "bob",
        data_request("notes.write@2", {"note": "x"}),
        "VERSION_NOT_AVAILABLE",
        grpc.StatusCode.NOT_FOUND,
    ),
    (
        "bob",
        data_request("notes.write", {"note": "x"}, extra_parts=1),
        "INVALID_REQUEST",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "bob",
        data_request("notes.write", ["not", "an", "object"]),
        "INVALID_REQUEST",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    ("bob", data_request("", {"note": "x"}), "INVALID_REQUEST", grpc.StatusCode.INVALID_ARGUMENT),
    (
        "bob",
        data_request("notes.write@>>1", {"note": "x"}),
        "INVALID_REQUEST",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "bob",
        raw_request("notes.write", b'{"note":"x"}', media_type="text/plain"),
        "CONTENT_TYPE_NOT_SUPPORTED",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "bob",
        data_request("notes.write", {"note": "x"}, message_id="bad id!"),
        "INVALID_REQUEST",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "bob",
        data_request("notes.write", {"note": 5}),
        "INVALID_INPUT",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "bob",
        raw_request("notes.write", b'{"note":"' + b"x" * (1024 - 10) + b'"}'),
        "PAYLOAD_TOO_LARGE",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
]


@pytest.mark.parametrize(("caller", "request_", "reason", "code"), REFUSALS)
async def test_refusals_are_errors_with_reason_and_audit_and_nothing_runs(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    caller: str,
    request_: a2a_pb2.SendMessageRequest,
    reason: str,
    code: grpc.StatusCode,
) -> None:
    async with A2APeer(pki, alice, caller) as peer:
        with pytest.raises(a2a_errors.A2AError) as info:
            await peer.send(request_)
    rpc = info.value.__cause__
    assert isinstance(rpc, grpc.aio.AioRpcError) and rpc.code() is code
    assert gateway_reason(info.value) == reason
    assert counter.calls == 0
    record = await last_record(alice)
    assert (record.decision, record.reason) == ("refuse", reason)
    if reason == "INVALID_REQUEST":
        assert isinstance(info.value, a2a_errors.InvalidRequestError)


async def test_payload_cap_applies_to_raw_bytes_exactly(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    at_cap = b'{"note":"' + b"x" * (1024 - 11) + b'"}'
    assert len(at_cap) == 1024
    await bob.send(raw_request("notes.write", at_cap))
    assert counter.calls == 1
    with pytest.raises(a2a_errors.A2AError) as info:
        await bob.send(raw_request("notes.write", at_cap[:-2] + b'x"}'))
    assert gateway_reason(info.value) == "PAYLOAD_TOO_LARGE"
    assert counter.calls == 1


async def test_a_reused_message_id_is_a_replay(
    alice: Agent, bob: A2APeer, counter: WriteCounter
) -> None:
    await bob.send(data_request("notes.write", {"note": "a"}, message_id="m-1"))
    with pytest.raises(a2a_errors.A2AError) as info:
        await bob.send(data_request("notes.write", {"note": "a"}, message_id="m-1"))
    assert gateway_reason(info.value) == "REPLAYED_REQUEST"
    assert counter.calls == 1
    record = await last_record(alice)
    assert (record.reason, record.request_id) == ("REPLAYED_REQUEST", "m-1")
