"""An a2a-sdk client calls, over A2A 1.0, a gateway that fronts an a2a-sdk agent.

SDK client → bob (lf.a2a.v1 servicer, policy, audit) → legacy (a2a-sdk agent
behind ``[[upstreams]]``): the gateway sits between two pieces of the official
SDK without either knowing, and its policy still decides before anything reaches
the upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.utils.errors import A2AError

from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import A2APeer, data_request, gateway_reason, output_of
from tests.helpers.a2a_upstream import SdkAgent, grpc_upstream
from tests.helpers.agents import Pki, spiffe
from tests.helpers.fronting import LEGACY, fronted, outcome, records


@pytest.fixture
async def legacy() -> SdkAgent:
    return SdkAgent()


@pytest.fixture
async def bob(pki: Pki, tmp_path: Path, legacy: SdkAgent) -> AsyncIterator[Agent]:
    async with grpc_upstream(legacy, pki, "legacy") as address:
        async with fronted(
            pki, tmp_path, {"id": LEGACY, "binding": "grpc", "address": address}
        ) as agent:
            yield agent


async def test_a2a_client_reaches_the_fronted_sdk_agent_through_the_policy(
    pki: Pki, bob: Agent, legacy: SdkAgent
) -> None:
    async with A2APeer(pki, bob, "alice") as alice:
        task = await alice.send(data_request("legacy.echo", {"text": "hi"}))
        searched = await alice.send(data_request("legacy.search", {"query": "audit", "limit": 2}))
    assert output_of(task) == {"text": "echo: hi"}
    assert task.artifacts[0].metadata["a2agw.served_version"] == "1.0.0"
    # Value turned the limit into a double on the way in; the contract made it an
    # integer again before the upstream saw only the declared fields.
    assert output_of(searched)["seen"] == {"query": "audit", "limit": 2}
    assert [r.parts for r in legacy.received] == [
        [{"text": "hi"}],
        [{"data": {"query": "audit", "limit": 2}, "mediaType": "application/json"}],
    ]
    rows = await records(bob)
    assert [outcome(r) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "OK"),
        (spiffe("alice"), "legacy.search", "allow", "OK"),
    ]


async def test_a2a_refusals_never_reach_the_fronted_agent(
    pki: Pki, bob: Agent, legacy: SdkAgent
) -> None:
    async with A2APeer(pki, bob, "carol") as carol:
        with pytest.raises(A2AError) as write:
            await carol.send(data_request("legacy.store", {"text": "x"}))
        with pytest.raises(A2AError) as ungranted:
            await carol.send(data_request("legacy.echo", {"text": "x"}))
    assert gateway_reason(write.value) == "RISK_NOT_GRANTED"
    assert gateway_reason(ungranted.value) == "CAPABILITY_NOT_GRANTED"
    assert legacy.received == []
    rows = await records(bob)
    assert [outcome(r) for r in rows] == [
        (spiffe("carol"), "legacy.store", "refuse", "RISK_NOT_GRANTED"),
        (spiffe("carol"), "legacy.echo", "refuse", "CAPABILITY_NOT_GRANTED"),
    ]
