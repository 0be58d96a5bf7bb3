"""Probe: a capability's output is checked against its contract strictly, never coerced.

docs/capabilities.md (and ``ContractModel``): output models have "strict types,
unknown fields refused"; docs/a2a.md: a fronted upstream's answer "is then
validated against the contract and digested like every output".

Defect found: the runner validated every output with ``strict=False``, which
overrides the models' ``strict=True``. A capability (or a hostile upstream)
answering ``{"count": "5"}`` for an integer field, ``1`` or ``"yes"`` for a
boolean, ``2.5``-like floats' whole cousins (``2.0``) for an integer, was
answered ``OK``: the caller got ``{"count": 5, "flag": true}``, a value the
capability never returned, and the evidence digest covered those coerced
bytes, not the capability's. Now such an output is ``INVALID_OUTPUT``
(audited ``allow``/``INVALID_OUTPUT``), exactly as an output of the wrong type.

What stays: JSON's own forms of strict values (an array for a tuple field),
and, for upstreams, the documented whole doubles of ``integer`` fields
(``google.protobuf.Value`` carries every number as a double).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import json_format

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import CapabilityRegistry, capability
from gateway.client.peer_client import PeerClient
from gateway.errors import InvalidOutput
from gateway.runtime.agent import Agent
from tests.helpers.a2a_hostile_upstream import scripted_grpc_upstream
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, started, write_policy
from tests.helpers.fronting import LEGACY, fronted

ALICE = spiffe("alice")


class Pick(ContractModel):
    case: str


class Counted(ContractModel):
    count: int
    flag: bool
    ids: tuple[int, ...] = ()


ANSWERS: dict[str, dict[str, Any]] = {
    # coercions lax validation made
    "string for int": {"count": "5", "flag": True},
    "float for int": {"count": 2.0, "flag": True},
    "int for bool": {"count": 5, "flag": 1},
    "string for bool": {"count": 5, "flag": "yes"},
    "string in an int array": {"count": 5, "flag": True, "ids": ["7"]},
    # what strict JSON accepts as it is
    "exact": {"count": 5, "flag": True, "ids": [7, 8]},
}
COERCED = [name for name in ANSWERS if name != "exact"]


@dataclass
class Answers:
    ran: list[str] = field(default_factory=list)

    def registry(self) -> CapabilityRegistry:
        @capability("probe.count", "1.0.0", risk="read", timeout=5.0, idempotent=True)
        async def count(inp: Pick, ctx: CallContext) -> Counted:
            """Answer the raw output the test picked (not a model: no model checks first)."""
            self.ran.append(inp.case)
            return ANSWERS[inp.case]  # type: ignore[return-value]

        @capability("probe.built", "1.0.0", risk="read", timeout=5.0, idempotent=True)
        async def built(inp: Pick, ctx: CallContext) -> Counted:
            """A model instance made without its checks, holding the picked values."""
            self.ran.append(inp.case)
            return Counted.model_construct(**ANSWERS[inp.case])

        registry = CapabilityRegistry()
        registry.register(count)
        registry.register(built)
        return registry


@pytest.fixture
async def bob(pki: Pki, tmp_path: Path) -> AsyncIterator[tuple[Agent, Answers]]:
    answers = Answers()
    policy = write_policy(
        tmp_path / "bob-policy.toml", [grant("alice", ["probe.count", "probe.built"])]
    )
    agent = await started(agent_config(pki, tmp_path, "bob", policy), answers.registry())
    yield agent, answers
    await agent.stop()


async def _outcomes(agent: Agent) -> list[tuple[str, str, str, str]]:
    await agent.audit.flush()
    return [
        (r.peer_id, r.capability, r.decision, r.reason) for r in audit_rows(agent.config.audit_db)
    ]


@pytest.mark.parametrize("capability_name", ["probe.count", "probe.built"])
@pytest.mark.parametrize("case", COERCED)
async def test_an_output_of_the_wrong_type_is_invalid_output_not_coerced(
    pki: Pki,
    bob: tuple[Agent, Answers],
    case: str,
    capability_name: str,
    recwarn: pytest.WarningsRecorder,
) -> None:
    agent, answers = bob
    async with PeerClient(agent.config.id, agent.address, pki.material("alice")) as peer:
        with pytest.raises(InvalidOutput) as caught:
            result = await peer.invoke(capability_name, {"case": case})
            pytest.fail(f"answered OK with {result.output()!r}")  # what lax coercion made
    assert caught.value.reason == "INVALID_OUTPUT"
    assert answers.ran == [case]  # it ran once; only its output was refused
    assert await _outcomes(agent) == [(ALICE, capability_name, "allow", "INVALID_OUTPUT")]
    # Pydantic's serializer warnings quote the value: no output content reaches a log.
    assert [str(w.message) for w in recwarn if "input_value" in str(w.message)] == []


async def test_an_exact_output_passes_and_its_digest_covers_what_the_caller_got(
    pki: Pki, bob: tuple[Agent, Answers]
) -> None:
    agent, _ = bob
    async with PeerClient(agent.config.id, agent.address, pki.material("alice")) as peer:
        result = await peer.invoke("probe.count", {"case": "exact"})
    assert result.output() == ANSWERS["exact"]  # the array for a tuple: JSON's form, strict
    canonical = json.dumps(
        ANSWERS["exact"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    assert result.evidence_sha256 == hashlib.sha256(canonical).hexdigest()
    assert await _outcomes(agent) == [(ALICE, "probe.count", "allow", "OK")]


# --- fronted upstreams ------------------------------------------------------------------


@dataclass
class DataUpstream(a2a_pb2_grpc.A2AServiceServicer):
    """Answers every SendMessage with a completed task whose artifact holds ``data``."""

    data: dict[str, Any] = field(default_factory=dict)
    sent: int = 0

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.SendMessageResponse:
        self.sent += 1
        answer = a2a_pb2.SendMessageResponse()
        answer.task.id = "t-1"
        answer.task.context_id = "c-1"
        answer.task.status.state = a2a_pb2.TASK_STATE_COMPLETED
        part = answer.task.artifacts.add(artifact_id="a-1").parts.add()
        json_format.ParseDict(self.data, part.data)
        return answer


UPSTREAM_COERCED = {
    "string for an array item": {"hits": [5]},  # hits: array of strings
    "number for a string": {"hits": ["a"], "seen": {"query": 7}},
    "string for an integer": {"hits": ["a"], "seen": {"query": "q", "limit": "3"}},
    "bool for an integer": {"hits": ["a"], "seen": {"query": "q", "limit": True}},
    "fraction for an integer": {"hits": ["a"], "seen": {"query": "q", "limit": 2.5}},
}


async def _search_through_bob(
    pki: Pki, tmp_path: Path, data: dict[str, Any]
) -> tuple[object, list[tuple[str, str, str, str]], int]:
    fake = DataUpstream(data=data)
    async with scripted_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob:
            async with PeerClient(bob.config.id, bob.address, pki.material("alice")) as peer:
                try:
                    result: object = (await peer.invoke("legacy.search", {"query": "q"})).output()
                except InvalidOutput as err:
                    result = err
            outcomes = await _outcomes(bob)
    return result, outcomes, fake.sent


@pytest.mark.parametrize("case", UPSTREAM_COERCED.keys())
async def test_an_upstream_answer_of_the_wrong_type_is_invalid_output(
    pki: Pki, tmp_path: Path, case: str
) -> None:
    result, outcomes, sent = await _search_through_bob(pki, tmp_path, UPSTREAM_COERCED[case])
    assert isinstance(result, InvalidOutput), f"answered OK with {result!r}"
    assert outcomes == [(ALICE, "legacy.search", "allow", "INVALID_OUTPUT")]
    assert sent == 1


async def test_an_upstreams_whole_double_for_an_integer_is_still_an_integer(
    pki: Pki, tmp_path: Path
) -> None:
    data = {"hits": ["a", "b"], "seen": {"query": "q", "limit": 3}}  # 3 travels as 3.0
    result, outcomes, sent = await _search_through_bob(pki, tmp_path, data)
    assert result == data
    assert type(result["seen"]["limit"]) is int  # type: ignore[index]
    assert outcomes == [(ALICE, "legacy.search", "allow", "OK")]
    assert sent == 1
