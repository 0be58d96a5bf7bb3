"""Existing a2a-sdk agents fronted through ``[[upstreams]]`` (real SDK servers, real mTLS).

bob fronts ``legacy`` (an a2a-sdk agent: executor + DefaultRequestHandler +
InMemoryTaskStore) and serves its skills as capabilities; alice and carol call
bob over a2agw.v1. Every test checks the exact outcome, bob's audit record and
what the upstream received (so a refusal provably never reached it).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry import CapabilityRegistry
from capabilities.runner import canonical_json
from gateway.errors import (
    CapabilityFailed,
    CapabilityTimeout,
    GatewayError,
    InvalidOutput,
    PeerUnavailable,
)
from gateway.plans import Plan
from gateway.plans.task import PlanTaskState
from gateway.runtime.agent import Agent
from gateway.transport.tls import MESSAGE_CEILING
from tests.helpers.a2a_upstream import SdkAgent, closed_port, grpc_upstream, jsonrpc_upstream
from tests.helpers.agents import Pki, outbound_rule, spiffe, start_peer
from tests.helpers.fronting import LEGACY, client, fronted, outcome, records


async def refusal(
    bob: Agent, caller: str, capability: str, payload: dict[str, Any], pki: Pki
) -> GatewayError:
    async with client(pki, bob, caller) as peer:
        with pytest.raises(GatewayError) as caught:
            await peer.invoke(capability, payload)
    return caught.value


@pytest.fixture
async def legacy() -> SdkAgent:
    return SdkAgent()


@pytest.fixture
async def grpc_bob(pki: Pki, tmp_path: Path, legacy: SdkAgent) -> AsyncIterator[Agent]:
    """bob fronting legacy over gRPC with mTLS (legacy holds its own SPIFFE certificate)."""
    async with grpc_upstream(legacy, pki, "legacy") as address:
        async with fronted(
            pki, tmp_path, {"id": LEGACY, "binding": "grpc", "address": address}
        ) as bob:
            yield bob


async def test_grpc_mtls_text_skill_through_invoke(
    pki: Pki, grpc_bob: Agent, legacy: SdkAgent
) -> None:
    async with client(pki, grpc_bob) as peer:
        result = await peer.invoke("legacy.echo", {"text": "hi"})
        legacy.mode = "message"  # a direct Message answer is read like a task's artifacts
        direct = await peer.invoke("legacy.echo", {"text": "there"})
    assert (result.output(), result.served_version) == ({"text": "echo: hi"}, "1.0.0")
    assert direct.output() == {"text": "direct: there"}
    assert [r.parts for r in legacy.received] == [[{"text": "hi"}], [{"text": "there"}]]
    assert [r.metadata for r in legacy.received] == [{"a2agw.skill": "echo"}] * 2
    rows = await records(grpc_bob)
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.echo", "allow", "OK")] * 2
    assert rows[0].payload_size == len(b'{"text":"hi"}')


async def test_structured_skill_sends_only_the_declared_fields(
    pki: Pki, grpc_bob: Agent, legacy: SdkAgent
) -> None:
    async with client(pki, grpc_bob) as peer:
        full = await peer.invoke("legacy.search", {"query": "audit", "limit": 3})
        short = await peer.invoke("legacy.search", {"query": "logs"})
    # Value carries numbers as doubles; the output contract makes 3.0 an integer again.
    assert full.output() == {"hits": ["audit", "audit"], "seen": {"query": "audit", "limit": 3}}
    assert full.payload == b'{"hits":["audit","audit"],"seen":{"limit":3,"query":"audit"}}'
    assert short.output() == {"hits": ["logs", "logs"], "seen": {"query": "logs"}}
    assert [r.parts for r in legacy.received] == [
        [{"data": {"query": "audit", "limit": 3}, "mediaType": "application/json"}],
        [{"data": {"query": "logs"}, "mediaType": "application/json"}],
    ]
    assert legacy.received[1].metadata == {"a2agw.skill": "search"}


async def test_refusals_by_policy_never_reach_the_upstream(
    pki: Pki, grpc_bob: Agent, legacy: SdkAgent
) -> None:
    cases = [
        ("carol", "legacy.store", {"text": "x"}, "RISK_NOT_GRANTED"),
        ("carol", "legacy.echo", {"text": "x"}, "CAPABILITY_NOT_GRANTED"),
        ("mallory", "legacy.echo", {"text": "x"}, "UNKNOWN_PEER"),
        ("alice", "legacy.echo", {"text": "x" * 300}, "PAYLOAD_TOO_LARGE"),
        ("alice", "legacy.search", {"query": "q", "secret": "s"}, "INVALID_INPUT"),
        ("alice", "legacy.echo", {"text": 5}, "INVALID_INPUT"),
    ]
    for caller, capability, payload, reason in cases:
        err = await refusal(grpc_bob, caller, capability, payload, pki)
        assert err.reason == reason, (caller, capability)
    assert legacy.received == []
    rows = await records(grpc_bob)
    assert [(r.peer_id, r.capability, r.decision, r.reason) for r in rows] == [
        (spiffe(caller), capability, "refuse", reason) for caller, capability, _, reason in cases
    ]


async def test_describe_lists_the_fronted_skills_as_capabilities(pki: Pki, grpc_bob: Agent) -> None:
    async with client(pki, grpc_bob) as peer:
        description = await peer.describe()
    offered = {c.name: c for c in description.capabilities}
    assert sorted(offered) == ["legacy.echo", "legacy.search", "legacy.store"]
    search = offered["legacy.search"]
    assert (search.version, search.risk, search.timeout_seconds) == ("2.1.0", "read", 5.0)
    assert sorted(search.input_schema["properties"]) == ["limit", "query"]
    assert search.input_schema["required"] == ["query"]
    assert offered["legacy.echo"].input_schema["required"] == ["text"]


async def test_upstream_down_is_peer_unavailable_and_bob_keeps_serving(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    down = {"binding": "grpc", "address": f"127.0.0.1:{closed_port()}"}  # plaintext, loopback
    async with grpc_upstream(legacy, pki, "legacy") as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up, down) as bob, client(pki, bob) as peer:
            with pytest.raises(PeerUnavailable) as caught:
                await peer.invoke("gone.echo", {"text": "hi"})
            assert caught.value.reason == "PEER_UNAVAILABLE"
            still = await peer.invoke("legacy.echo", {"text": "still here"})
            rows = await records(bob)
    assert still.output() == {"text": "echo: still here"}
    assert [(outcome(r), r.detail) for r in rows] == [
        ((spiffe("alice"), "gone.echo", "allow", "PEER_UNAVAILABLE"), "PEER_UNAVAILABLE"),
        ((spiffe("alice"), "legacy.echo", "allow", "OK"), ""),
    ]


async def test_slow_upstream_is_capability_timeout(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    legacy.mode = "slow"
    async with grpc_upstream(legacy, pki, "legacy") as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up, timeout=0.5) as bob, client(pki, bob) as peer:
            with pytest.raises(CapabilityTimeout):
                await peer.invoke("legacy.echo", {"text": "hi"})
            legacy.release.set()
            legacy.mode = "echo"
            again = await peer.invoke("legacy.echo", {"text": "again"})
            rows = await records(bob)
    assert again.output() == {"text": "echo: again"}
    assert [outcome(r) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "CAPABILITY_TIMEOUT"),
        (spiffe("alice"), "legacy.echo", "allow", "OK"),
    ]


async def test_answers_outside_the_contract_are_invalid_output(
    pki: Pki, grpc_bob: Agent, legacy: SdkAgent, caplog: pytest.LogCaptureFixture
) -> None:
    legacy.mode = "garbage"  # a data part where text is expected; "hits" not a list
    async with client(pki, grpc_bob) as peer:
        with pytest.raises(InvalidOutput) as no_text:
            await peer.invoke("legacy.echo", {"text": "hi"})
        # Said to the caller and to the operator, who can fix it (a newcomer could not).
        assert no_text.value.message == "legacy.echo@1.0.0 returned nothing, not an object"
        assert any(
            "without a text part (a skill without output_schema reads text parts: declare "
            "output_schema for an answer in a data part)" in r.getMessage()
            for r in caplog.records
        )
        with pytest.raises(InvalidOutput):
            await peer.invoke("legacy.search", {"query": "q"})
        legacy.mode = "fail"
        with pytest.raises(CapabilityFailed):
            await peer.invoke("legacy.echo", {"text": "hi"})
    assert len(legacy.received) == 3
    assert [outcome(r)[1:] for r in await records(grpc_bob)] == [
        ("legacy.echo", "allow", "INVALID_OUTPUT"),
        ("legacy.search", "allow", "INVALID_OUTPUT"),
        ("legacy.echo", "allow", "CAPABILITY_FAILED"),
    ]


async def test_write_skill_gets_a_write_ahead_record(
    pki: Pki, grpc_bob: Agent, legacy: SdkAgent
) -> None:
    async with client(pki, grpc_bob) as peer:
        result = await peer.invoke("legacy.store", {"text": "note"})
    assert result.output() == {"text": "echo: note"}
    assert [r.reason for r in await records(grpc_bob)] == ["ADMITTED", "OK"]


async def test_upstream_with_another_identity_is_refused_unsent(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    async with grpc_upstream(legacy, pki, "mallory") as address:  # same CA, other SPIFFE ID
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            with pytest.raises(PeerUnavailable):
                await peer.invoke("legacy.echo", {"text": "for legacy only"})
            rows = await records(bob)
    assert legacy.received == []
    assert [(outcome(r), r.detail) for r in rows] == [
        ((spiffe("alice"), "legacy.echo", "allow", "PEER_UNAVAILABLE"), "PEER_IDENTITY_MISMATCH")
    ]


async def test_jsonrpc_plaintext_on_loopback(pki: Pki, tmp_path: Path, legacy: SdkAgent) -> None:
    async with jsonrpc_upstream(legacy) as url:
        async with (
            fronted(pki, tmp_path, {"binding": "jsonrpc", "url": url}) as bob,
            client(pki, bob) as peer,
        ):
            echo = await peer.invoke("legacy.echo", {"text": "hi"})
            search = await peer.invoke("legacy.search", {"query": "audit", "limit": 2})
            rows = await records(bob)
    assert echo.output() == {"text": "echo: hi"}
    assert search.output() == {"hits": ["audit", "audit"], "seen": {"query": "audit", "limit": 2}}
    assert [r.parts for r in legacy.received] == [
        [{"text": "hi"}],
        [{"data": {"query": "audit", "limit": 2}, "mediaType": "application/json"}],
    ]
    assert [outcome(r)[2:] for r in rows] == [("allow", "OK")] * 2


async def test_jsonrpc_https_with_mtls_and_identity_check(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    async with jsonrpc_upstream(legacy, pki, "legacy") as url:
        up = {"id": LEGACY, "binding": "jsonrpc", "url": url}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            result = await peer.invoke("legacy.echo", {"text": "over https"})
    assert result.output() == {"text": "echo: over https"}
    assert [r.parts for r in legacy.received] == [[{"text": "over https"}]]


async def test_jsonrpc_https_with_another_identity_is_refused_unsent(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    async with jsonrpc_upstream(legacy, pki, "mallory") as url:
        up = {"id": LEGACY, "binding": "jsonrpc", "url": url}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            with pytest.raises(PeerUnavailable):
                await peer.invoke("legacy.echo", {"text": "for legacy only"})
            rows = await records(bob)
    assert legacy.received == []
    assert [(outcome(r)[2:], r.detail) for r in rows] == [
        (("allow", "PEER_UNAVAILABLE"), "PEER_IDENTITY_MISMATCH")
    ]


@pytest.mark.parametrize("size", [40, MESSAGE_CEILING + 1])
async def test_jsonrpc_endpoint_answering_non_a2a_is_invalid_output(
    pki: Pki, tmp_path: Path, legacy: SdkAgent, size: int
) -> None:
    async with jsonrpc_upstream(legacy, garbage=size) as url:
        up = {"binding": "jsonrpc", "url": url}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            with pytest.raises(InvalidOutput):
                await peer.invoke("legacy.echo", {"text": "hi"})
            again = await refusal(bob, "carol", "legacy.echo", {"text": "hi"}, pki)
            rows = await records(bob)
    assert again.reason == "CAPABILITY_NOT_GRANTED"  # still serving
    assert [outcome(r)[2:] for r in rows] == [
        ("allow", "INVALID_OUTPUT"),
        ("refuse", "CAPABILITY_NOT_GRANTED"),
    ]


async def test_jsonrpc_upstream_down_is_peer_unavailable(pki: Pki, tmp_path: Path) -> None:
    up = {"binding": "jsonrpc", "url": f"http://127.0.0.1:{closed_port()}/a2a/jsonrpc"}
    async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
        with pytest.raises(PeerUnavailable):
            await peer.invoke("legacy.echo", {"text": "hi"})
        rows = await records(bob)
    assert [(outcome(r)[2:], r.detail) for r in rows] == [
        (("allow", "PEER_UNAVAILABLE"), "PEER_UNAVAILABLE")
    ]


async def test_plan_step_routed_to_the_fronting_agent(
    pki: Pki, tmp_path: Path, grpc_bob: Agent, legacy: SdkAgent
) -> None:
    alice = await start_peer(
        pki,
        tmp_path,
        "alice",
        CapabilityRegistry(),
        [],
        outbound=[outbound_rule("bob", ["legacy.echo", "legacy.search"])],
        peers=[grpc_bob],
    )
    try:
        result = await alice.run(
            Plan.model_validate(
                {
                    "goal": "ask the legacy agent",
                    "steps": [
                        {"id": "hello", "capability": "legacy.echo", "input": {"text": "hi"}},
                        {
                            "id": "find",
                            "capability": "legacy.search",
                            "depends_on": ["hello"],
                            "input": {
                                "query": {"$from": "hello.text"},
                                "limit": 1,
                                "secret": "not for the upstream",
                            },
                        },
                    ],
                }
            )
        )
    finally:
        await alice.stop(grace=0)
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert [result.steps[s].where for s in ("hello", "find")] == [spiffe("bob")] * 2
    assert result.output("find") == {
        "hits": ["echo: hi"] * 2,
        "seen": {"query": "echo: hi", "limit": 1},
    }
    evidence = result.steps["find"].evidence
    assert evidence is not None and evidence.served_version == "2.1.0"
    assert evidence.sha256 == hashlib.sha256(canonical_json(result.output("find"))).hexdigest()
    assert [r.parts for r in legacy.received] == [
        [{"text": "hi"}],
        [{"data": {"query": "echo: hi", "limit": 1}, "mediaType": "application/json"}],
    ]
    rows = await records(grpc_bob)
    assert [(outcome(r), r.step_id) for r in rows] == [
        ((spiffe("alice"), "legacy.echo", "allow", "OK"), "hello"),
        ((spiffe("alice"), "legacy.search", "allow", "OK"), "find"),
    ]
    assert all(r.task_id == result.task_id for r in rows)
