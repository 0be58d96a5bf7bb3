"""Version-scoped outbound rules over real agents: the version a rule allows is the one used.

bob serves ``ver.x`` 1.0.0 and 2.0.0 and grants both to alice; alice's
``[[outbound]]`` allows only ``ver.x@^1`` to bob. The static route check and the
run-time choice both go through ``select_routes``, so they pick the same
version: the highest one the step *and* the rule allow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, CapabilityRegistry, capability
from gateway.plans import Plan
from gateway.plans.task import PlanTaskState, StepStatus
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki, audit_rows, grant, outbound_rule, spiffe, start_peer

BOB = spiffe("bob")


class VerInput(ContractModel):
    """Nothing to say."""

    key: str


class VerOutput(ContractModel):
    """Which version answered."""

    served: str


def versioned(version: str, runs: dict[str, int]) -> Capability:
    @capability("ver.x", version, risk="read", timeout=5.0)
    async def serve(inp: VerInput, ctx: CallContext) -> VerOutput:
        """Answer with the version that ran (counts runs per version)."""
        runs[version] = runs.get(version, 0) + 1
        return VerOutput(served=version)

    return serve


@pytest.fixture
async def agents(pki: Pki, tmp_path: Path) -> AsyncIterator[tuple[Agent, Agent, dict[str, int]]]:
    runs: dict[str, int] = {}
    registry = CapabilityRegistry()
    for version in ("1.0.0", "2.0.0"):
        registry.register(versioned(version, runs))
    bob = await start_peer(pki, tmp_path, "bob", registry, [grant("alice", ["ver.x"])])
    alice = await start_peer(
        pki,
        tmp_path,
        "alice",
        CapabilityRegistry(),
        [],
        outbound=[outbound_rule("bob", ["ver.x@^1"])],
        peers=[bob],
    )
    try:
        yield alice, bob, runs
    finally:
        await alice.stop(grace=0)
        await bob.stop(grace=0)


def plan(version: str | None) -> Plan:
    step: dict[str, Any] = {"id": "a", "capability": "ver.x", "input": {"key": "k"}}
    if version is not None:
        step["version"] = version
    return Plan.model_validate({"goal": "versions", "steps": [step]})


async def test_unversioned_step_runs_the_highest_version_the_rule_allows(
    agents: tuple[Agent, Agent, dict[str, int]],
) -> None:
    alice, bob, runs = agents
    result = await alice.run(plan(None))
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK"), result.message
    step = result.steps["a"]
    assert (step.status, step.where, step.output) == (
        StepStatus.COMPLETED,
        BOB,
        {"served": "1.0.0"},
    )
    assert step.evidence is not None and step.evidence.served_version == "1.0.0"
    assert runs == {"1.0.0": 1}
    await bob.stop(grace=0)  # flushes the batch that holds the read's audit record
    served = [r.served_version for r in audit_rows(bob.config.audit_db) if r.capability == "ver.x"]
    assert served == ["1.0.0"]


async def test_step_asking_only_for_a_version_the_rule_refuses_is_refused_statically(
    agents: tuple[Agent, Agent, dict[str, int]],
) -> None:
    alice, bob, runs = agents
    result = await alice.run(plan("^2"))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "PLAN_INVALID")
    assert "ver.x@^2" in result.message
    assert result.steps == {} and runs == {}
    assert [r for r in audit_rows(bob.config.audit_db) if r.capability == "ver.x"] == []
