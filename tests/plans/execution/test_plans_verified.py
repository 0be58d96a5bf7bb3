"""Verified plan steps over real agents (loopback mTLS, SQLite): quorum, compare, checks.

bob and carol both serve the counting ``fault.*`` capabilities and grant them to
alice; alice (local ``text.echo`` only) may send every ``fault.*`` to both.
``fault.read`` answers ``{"key": KEY, "runs": N}`` with N counted per peer, so
two fresh peers agree and a peer that already ran once disagrees.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capabilities.builtin.echo import echo
from capabilities.registry import CapabilityRegistry
from gateway.plans import Plan
from gateway.plans.execution.verification import Confidence
from gateway.plans.task import PlanTaskState, StepStatus
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    agent_config,
    grant,
    outbound_rule,
    spiffe,
    start_peer,
    write_policy,
)
from tests.helpers.plan_capabilities import FaultyPeer, faulty_registry

FAULT_CAPS = ["fault.read", "fault.glance", "fault.write", "fault.brief", "fault.append"]
BOB, CAROL = spiffe("bob"), spiffe("carol")
NO_REVISIONS = {"max_revisions": 0, "max_elapsed_seconds": 20}


@dataclass
class Pair:
    alice: Agent
    faults: dict[str, FaultyPeer]

    def runs(self, capability: str) -> dict[str, int]:
        return {name: peer.total(capability) for name, peer in self.faults.items()}


@pytest.fixture
async def pair(pki: Pki, tmp_path: Path) -> AsyncIterator[Pair]:
    faults = {"bob": FaultyPeer(), "carol": FaultyPeer()}
    agents: list[Agent] = []
    try:
        for name in ("bob", "carol"):
            registry = faulty_registry(faults[name])
            agents.append(
                await start_peer(pki, tmp_path, name, registry, [grant("alice", FAULT_CAPS)])
            )
        outbound = [outbound_rule(name, FAULT_CAPS) for name in ("bob", "carol")]
        policy = write_policy(tmp_path / "alice-policy.toml", [], outbound)
        registry = CapabilityRegistry()
        registry.register(echo)
        peers = [(agent.config.id, agent.address) for agent in agents]
        alice = Agent(agent_config(pki, tmp_path, "alice", policy, peers), registry)
        await alice.start(watch_policy=False)
        agents.append(alice)
        yield Pair(alice, faults)
    finally:
        for agent in reversed(agents):
            await agent.stop(grace=0)


def plan(*steps: dict[str, Any], **extra: Any) -> Plan:
    document = {"goal": "verify", "budget": {"max_elapsed_seconds": 20}, **extra}
    return Plan.model_validate({**document, "steps": list(steps)})


def read(sid: str, capability: str = "fault.read", **extra: Any) -> dict[str, Any]:
    return {"id": sid, "capability": capability, "input": {"key": "k"}, **extra}


def use(**extra: Any) -> dict[str, Any]:
    """A step that depends on ``price`` and reads its key."""
    return {
        "id": "use",
        "capability": "fault.glance",
        "depends_on": ["price"],
        "input": {"key": {"$from": "price.key"}},
        **extra,
    }


@pytest.mark.slow
async def test_two_peers_agreeing_make_a_verified_result(pair: Pair) -> None:
    result = await pair.alice.run(plan(read("price", verify={"quorum": 2}), use()))
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    price = result.steps["price"]
    assert price.confidence is Confidence.VERIFIED
    assert sorted(e.where for e in price.sources) == [BOB, CAROL]
    assert {e.served_version for e in price.sources} == {"1.0.0"}
    assert len({e.sha256 for e in price.sources}) == 1
    assert price.candidates == ()
    assert pair.runs("fault.read") == {"bob": 1, "carol": 1}
    assert result.peer_calls == 3  # two sources, then the dependent step
    assert result.confidence is Confidence.VERIFIED
    stored = await pair.alice.plan_tasks.load(result.task_id)
    assert stored.steps["price"].confidence is Confidence.VERIFIED
    assert stored.steps["price"].sources == price.sources


async def test_disagreeing_peers_keep_both_outputs_and_stop_the_dependent(pair: Pair) -> None:
    pair.faults["carol"].runs["fault.read"] = 1  # carol will answer runs=2, bob runs=1
    result = await pair.alice.run(plan(read("price", verify={"quorum": 2}), use()))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "UNVERIFIED")
    assert "'use' was not run" in result.message
    price = result.steps["price"]
    assert (price.status, price.confidence) == (StepStatus.COMPLETED, Confidence.UNVERIFIED)
    assert sorted(c["runs"] for c in price.candidates) == [1, 2]
    assert len({e.sha256 for e in price.sources}) == 2
    assert "use" not in result.steps
    assert pair.runs("fault.glance") == {"bob": 0, "carol": 0}
    assert result.confidence is Confidence.UNVERIFIED


async def test_on_unverified_continue_runs_the_dependent(pair: Pair) -> None:
    pair.faults["carol"].runs["fault.read"] = 1
    result = await pair.alice.run(
        plan(read("price", verify={"quorum": 2}), use(on_unverified="continue"))
    )
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert result.steps["price"].confidence is Confidence.UNVERIFIED
    assert len(result.steps["price"].candidates) == 2
    assert pair.runs("fault.glance") == {"bob": 1, "carol": 0}
    assert result.confidence is Confidence.UNVERIFIED


async def test_compare_paths_ignore_the_fields_not_listed(pair: Pair) -> None:
    pair.faults["carol"].runs["fault.read"] = 1
    step = read("price", verify={"quorum": 2, "compare": ["key"]})
    result = await pair.alice.run(plan(step))
    assert result.state is PlanTaskState.COMPLETED
    assert result.steps["price"].confidence is Confidence.VERIFIED
    assert result.steps["price"].candidates == ()


async def test_one_silent_peer_gives_a_partial_result(pair: Pair) -> None:
    pair.faults["bob"].modes["fault.glance"] = "hang"
    result = await pair.alice.run(
        plan(read("price", "fault.glance", verify={"quorum": 2}, max_retries=0))
    )
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    price = result.steps["price"]
    assert price.confidence is Confidence.PARTIAL
    assert [e.where for e in price.sources] == [CAROL]
    assert price.notes == (f"{BOB}: CAPABILITY_TIMEOUT, no answer for the quorum",)
    assert result.confidence is Confidence.PARTIAL
    assert pair.faults["bob"].cancelled.get("fault.glance") == 1


async def test_a_failing_deterministic_check_fails_the_step(pair: Pair) -> None:
    step = read("price", expect={"equals": {"runs": 5}})
    result = await pair.alice.run(plan(step, budget=NO_REVISIONS))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "EXPECTATION_FAILED")
    assert "'runs' is not the expected value" in result.message
    assert pair.runs("fault.read") == {"bob": 1, "carol": 0}


async def test_a_passing_deterministic_check_verifies_a_single_source(pair: Pair) -> None:
    step = read("price", expect={"range": {"runs": {"min": 1, "max": 3}}, "equals": {"key": "k"}})
    result = await pair.alice.run(plan(step))
    assert result.state is PlanTaskState.COMPLETED
    assert result.steps["price"].confidence is Confidence.VERIFIED
    assert [e.where for e in result.steps["price"].all_evidence()] == [BOB]
    assert pair.runs("fault.read") == {"bob": 1, "carol": 0}


async def test_range_check_out_of_bounds_fails(pair: Pair) -> None:
    step = read("price", expect={"range": {"runs": {"min": 2}}})
    result = await pair.alice.run(plan(step, budget=NO_REVISIONS))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "EXPECTATION_FAILED")
    assert "outside [2, open]" in result.message


async def test_verify_on_a_plain_write_is_plan_invalid(pair: Pair) -> None:
    step = read("append", "fault.append", verify={"quorum": 2})
    result = await pair.alice.run(plan(step, max_risk="write"))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "PLAN_INVALID")
    assert "step 'append'" in result.message and "idempotent" in result.message
    assert pair.runs("fault.append") == {"bob": 0, "carol": 0}


async def test_a_quorum_above_the_sources_is_plan_invalid(pair: Pair) -> None:
    result = await pair.alice.run(plan(read("price", verify={"quorum": 3})))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "PLAN_INVALID")
    assert "step 'price': verify needs 3 sources; only 2" in result.message
    assert pair.runs("fault.read") == {"bob": 0, "carol": 0}


async def test_max_tool_calls_limits_local_runs(pair: Pair) -> None:
    steps = [{"id": f"e{i}", "capability": "text.echo", "input": {"text": "x"}} for i in range(2)]
    result = await pair.alice.run(
        plan(*steps, max_parallel=1, budget={"max_tool_calls": 1, "max_elapsed_seconds": 20})
    )
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "BUDGET_EXHAUSTED")
    assert "max_tool_calls (1) reached" in result.message
    assert result.tool_calls == 1
    stored = await pair.alice.plan_tasks.load(result.task_id)
    assert stored.usage.tool_calls == 1
