"""Regressions found by probing plans and outbound routing with a lying peer.

The lying peer is a real gRPC server with bob's certificate (mTLS, on
127.0.0.1:0) that answers ``Describe`` with the contract of a real capability,
optionally altered, and ``Invoke`` with whatever the test sets; it records every
payload it receives. alice is a real agent (SQLite task store) that runs no
capability herself, so every step goes to it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, CapabilityRegistry, capability
from gateway.errors import InvalidInput, PlanInvalid
from gateway.plans import Plan, parse_plan
from gateway.plans.execution.minimise import declared_part
from gateway.plans.task import PlanTaskState, StepStatus
from gateway.runtime.agent import Agent
from gateway.transport.tls import server_options
from gateway.wire.v1 import gateway_pb2
from tests.helpers.agents import Pki, agent_config, outbound_rule, spiffe, write_policy

BOB = spiffe("bob")


class Title(ContractModel):
    title: str


class DocInput(ContractModel):
    key: str
    doc: Title
    tags: list[Title] = []
    extra: Title | None = None


class DocOutput(ContractModel):
    ok: bool


@capability("doc.read", "1.0.0", risk="read", timeout=2.0)
async def doc_read(inp: DocInput, ctx: CallContext) -> DocOutput:
    """Read a document (its contract is what the lying peer advertises)."""
    return DocOutput(ok=True)


Mutate = Callable[[gateway_pb2.CapabilityDescriptor], None]


class LyingPeer:
    """A PeerGateway server with bob's certificate that says what the test makes it say."""

    def __init__(self, pki: Pki, served: Capability) -> None:
        self._pki = pki
        self._served = served
        self.payloads: list[bytes] = []
        self.answer: bytes = b'{"ok": true}'
        self.mutate: Mutate | None = None
        self.address = ""
        self._server: aio.Server | None = None

    async def start(self) -> None:
        server = aio.server(options=server_options())
        handlers = {
            "Describe": grpc.unary_unary_rpc_method_handler(
                self._describe,
                request_deserializer=gateway_pb2.DescribeRequest.FromString,
                response_serializer=gateway_pb2.DescribeResponse.SerializeToString,
            ),
            "Invoke": grpc.unary_unary_rpc_method_handler(
                self._invoke,
                request_deserializer=gateway_pb2.InvokeRequest.FromString,
                response_serializer=gateway_pb2.InvokeResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("a2agw.v1.PeerGateway", handlers),)
        )
        port = server.add_secure_port("127.0.0.1:0", self._pki.material("bob").server_credentials())
        await server.start()
        self._server, self.address = server, f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    async def _describe(
        self, request: gateway_pb2.DescribeRequest, context: object
    ) -> gateway_pb2.DescribeResponse:
        contract = self._served.contract
        reply = gateway_pb2.DescribeResponse(
            agent_id=BOB, protocol_version="a2agw.v1", max_payload_bytes=65536
        )
        descriptor = reply.capabilities.add(
            name=contract.name,
            version=str(contract.version),
            risk=contract.risk.value,
            timeout_seconds=contract.timeout_seconds,
            idempotent=contract.idempotent,
            input_schema_json=json.dumps(contract.input_schema()),
            output_schema_json=json.dumps(contract.output_schema()),
        )
        if self.mutate is not None:
            self.mutate(descriptor)
        return reply

    async def _invoke(
        self, request: gateway_pb2.InvokeRequest, context: object
    ) -> gateway_pb2.InvokeResponse:
        self.payloads.append(bytes(request.payload))
        return gateway_pb2.InvokeResponse(
            request_id=request.request_id,
            capability=request.capability,
            served_version="1.0.0",
            payload=self.answer,
            evidence_sha256=hashlib.sha256(self.answer).hexdigest(),
        )


@pytest.fixture
async def lying_bob(pki: Pki) -> AsyncIterator[LyingPeer]:
    peer = LyingPeer(pki, doc_read)
    await peer.start()
    yield peer
    await peer.stop()


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, lying_bob: LyingPeer) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [], [outbound_rule("bob", ["doc.read"])])
    config = agent_config(pki, tmp_path, "alice", policy, [(BOB, lying_bob.address)])
    agent = Agent(config, CapabilityRegistry())
    await agent.start(watch_policy=False)
    yield agent
    await agent.stop(grace=0)


def read_step(doc_input: dict[str, Any]) -> Plan:
    return Plan.model_validate(
        {
            "goal": "g",
            "budget": {"max_revisions": 0},
            "steps": [{"id": "s", "capability": "doc.read", "input": doc_input}],
        }
    )


async def test_nested_fields_the_contract_does_not_declare_never_leave(
    alice: Agent, lying_bob: LyingPeer
) -> None:
    result = await alice.run(
        read_step(
            {
                "key": "k",
                "doc": {"title": "t", "secret": "S1"},
                "tags": [{"title": "a", "secret": "S2"}],
                "extra": {"title": "x", "secret": "S3"},
                "undeclared": "S4",
            }
        )
    )
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert [json.loads(p) for p in lying_bob.payloads] == [
        {"doc": {"title": "t"}, "extra": {"title": "x"}, "key": "k", "tags": [{"title": "a"}]}
    ]


async def test_deeply_nested_peer_output_fails_the_step_invalid_output(
    alice: Agent, lying_bob: LyingPeer
) -> None:
    lying_bob.answer = b"[" * 100_000 + b"]" * 100_000
    result = await alice.run(read_step({"key": "k", "doc": {"title": "t"}}))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "INVALID_OUTPUT")
    step = result.steps["s"]
    assert (step.status, step.reason, step.where) == (StepStatus.FAILED, "INVALID_OUTPUT", BOB)
    assert "nests too deeply" in step.message
    assert len(lying_bob.payloads) == 1


@pytest.mark.parametrize(
    "field, text",
    [
        ("input_schema_json", "[]"),
        ("input_schema_json", "5"),
        ("output_schema_json", "[]"),
        ("output_schema_json", "[" * 100_000 + "]" * 100_000),
    ],
)
async def test_malformed_advertised_schema_is_no_route_and_nothing_is_sent(
    alice: Agent, lying_bob: LyingPeer, field: str, text: str
) -> None:
    lying_bob.mutate = lambda descriptor: setattr(descriptor, field, text)
    result = await alice.run(read_step({"key": "k", "doc": {"title": "t"}}))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, PlanInvalid.reason)
    assert "no local capability or authorized peer offers doc.read" in result.message
    assert lying_bob.payloads == []


def test_plan_nested_past_the_parser_is_plan_invalid() -> None:
    deep = "[" * 5000 + "]" * 5000
    text = '{"goal": "g", "steps": [{"id": "a", "capability": "text.echo", "input": {"x": %s}}]}'
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(text % deep, "plan.json")
    assert caught.value.reason == "PLAN_INVALID"
    assert caught.value.message.startswith("plan.json: (top level): Invalid JSON: recursion")


def test_a_schema_that_loops_or_points_outside_sends_nothing() -> None:
    for schema in ({"$ref": "#"}, {"$ref": "https://example.org/schema.json"}):
        with pytest.raises(InvalidInput):
            declared_part({"a": {"b": 1}}, schema, schema)


async def test_a_peer_with_another_identity_gets_nothing_and_is_named(
    pki: Pki, tmp_path: Path, lying_bob: LyingPeer
) -> None:
    carol = spiffe("carol")  # configured at the address where bob's certificate answers
    policy = write_policy(
        tmp_path / "alice-policy.toml", [], [outbound_rule("carol", ["doc.read"])]
    )
    config = agent_config(pki, tmp_path, "alice", policy, [(carol, lying_bob.address)])
    agent = Agent(config, CapabilityRegistry())
    await agent.start(watch_policy=False)
    try:
        result = await agent.run(read_step({"key": "k", "doc": {"title": "t"}}))
    finally:
        await agent.stop(grace=0)
    assert (result.state, result.reason) == (PlanTaskState.FAILED, PlanInvalid.reason)
    assert f"could not ask {carol} (PEER_IDENTITY_MISMATCH)" in result.message
    assert lying_bob.payloads == []


@pytest.mark.parametrize(
    "schema, problem",
    [
        ({"properties": {"ok": {"type": "nonsense"}}}, "$.properties.ok.type: not a JSON type"),
        ({"properties": {"id": {"pattern": "("}}}, "$.properties.id.pattern: not a regular"),
        ({"required": "ok"}, "$.required: must be a list of field names"),
        ({"$ref": "#/$defs/Missing"}, "$.$ref: not a reference into this schema"),
    ],
)
def test_a_malformed_expect_schema_is_plan_invalid_before_anything_runs(
    schema: dict[str, Any], problem: str
) -> None:
    step = {"id": "w", "capability": "kv.put", "input": {"key": "k"}, "expect": {"schema": schema}}
    text = json.dumps({"goal": "g", "max_risk": "write", "steps": [step]})
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(text, "plan.json")
    first = caught.value.message.splitlines()[0]
    assert first.startswith(
        "plan.json: steps.0.expect (step 'w'): Value error, schema is malformed"
    )
    assert problem in first
