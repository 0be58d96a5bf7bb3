"""Plans over real agents on loopback (mTLS, SQLite): routing, payloads, retries, failover.

Topology: alice runs plans and only has ``text.echo`` locally; bob, carol and
dave serve built-ins plus counting/probing capabilities and grant alice all of
them. alice's outbound rules decide who may receive what; bob may call carol.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capabilities.builtin.echo import echo
from capabilities.registry import CapabilityRegistry
from capabilities.runner import canonical_json
from gateway.client.peer_client import PeerClient
from gateway.errors import PeerUnavailable
from gateway.plans import Plan
from gateway.plans.task import PlanTaskState, StepStatus
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    Probe,
    WriteCounter,
    audit_rows,
    grant,
    mesh_registry,
    outbound_rule,
    spiffe,
    start_peer,
    write_policy,
)

GRANTED = [
    "text.search",
    "text.echo",
    "notes.write",
    "kv.put",
    "kv.get",
    "slow.wait",
    "deadline.probe",
    "relay.ask",
]
OUTBOUND = {
    "bob": ["text.search", "notes.write", "slow.wait", "relay.ask", "kv.get"],
    "carol": ["text.search", "notes.write", "kv.put", "slow.wait", "deadline.probe"],
    "dave": ["text.search"],
}
PEERS = ("bob", "carol", "dave")


@dataclass
class Mesh:
    alice: Agent
    peers: dict[str, Agent]
    counters: dict[str, WriteCounter]
    probes: dict[str, Probe]
    base: Path

    def peer_policy(self, name: str, grants: list[dict[str, Any]]) -> None:
        write_policy(self.base / f"{name}-policy.toml", grants)
        assert self.peers[name].policies.reload() is None


def alice_registry() -> CapabilityRegistry:
    registry = CapabilityRegistry()
    registry.register(echo)
    return registry


async def start_alice(pki: Pki, base: Path, peers: list[Agent], **kw: Any) -> Agent:
    outbound = [outbound_rule(name, caps) for name, caps in OUTBOUND.items()]
    return await start_peer(
        pki, base, "alice", alice_registry(), [], outbound=outbound, peers=peers, **kw
    )


@pytest.fixture
async def mesh(pki: Pki, tmp_path: Path) -> AsyncIterator[Mesh]:
    counters = {name: WriteCounter() for name in PEERS}
    probes = {name: Probe() for name in PEERS}

    async def peer(name: str, **kw: Any) -> Agent:
        grants = [grant("alice", GRANTED)]
        if name == "carol":
            grants.append(grant("bob", ["deadline.probe"]))
        registry = mesh_registry(counters[name], tmp_path / f"{name}-state", probes[name])
        return await start_peer(pki, tmp_path, name, registry, grants, **kw)

    carol = await peer("carol")
    bob = await peer("bob", outbound=[outbound_rule("carol", ["deadline.probe"])], peers=[carol])
    dave = await peer("dave")
    peers = {"bob": bob, "carol": carol, "dave": dave}
    alice = await start_alice(pki, tmp_path, [bob, carol, dave])
    scene = Mesh(alice, peers, counters, probes, tmp_path)
    yield scene
    for agent in (scene.alice, *peers.values()):  # a test may have replaced alice
        await agent.stop(grace=0)


def plan(*steps: dict[str, Any], **extra: Any) -> Plan:
    return Plan.model_validate({"goal": "secret goal text", "steps": list(steps), **extra})


def search(sid: str, query: str = "audit", **extra: Any) -> dict[str, Any]:
    return {"id": sid, "capability": "text.search", "input": {"query": query}, **extra}


async def test_local_first_then_authorized_peer_with_evidence(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(
            {"id": "echo", "capability": "text.echo", "input": {"text": "hi"}},
            search("find", "audit log", version="^1"),
        )
    )
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert result.steps["echo"].where == "local"
    assert result.steps["find"].where == spiffe("bob")
    evidence = result.steps["find"].evidence
    assert evidence is not None
    assert (evidence.step_id, evidence.where, evidence.served_version) == (
        "find",
        spiffe("bob"),
        "1.0.0",
    )
    assert evidence.sha256 == hashlib.sha256(canonical_json(result.output("find"))).hexdigest()
    assert result.output("find")["items"][0]["id"] == "doc-3"


async def test_outbound_rules_pick_the_peer_and_refusal_is_noted(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(
            {"id": "put", "capability": "kv.put", "input": {"key": "k", "value": "v"}},
            max_risk="write",
        )
    )
    assert result.state is PlanTaskState.COMPLETED
    assert result.steps["put"].where == spiffe("carol")  # bob offers kv.put, but not to be sent it
    assert f"{spiffe('bob')}: OUTBOUND_NOT_ALLOWED" in result.steps["put"].notes


async def test_payload_carries_only_the_declared_fields(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(
            search("find"),
            {
                "id": "note",
                "capability": "notes.write",
                "depends_on": ["find"],
                "input": {
                    "note": {"$from": "find.items.0.title"},
                    "secret": "not for bob",
                    "context": {"$from": "find.items"},
                },
            },
            max_risk="write",
        )
    )
    assert result.state is PlanTaskState.COMPLETED
    assert result.steps["note"].where == spiffe("bob")
    assert mesh.counters["bob"].seen_fields == [frozenset({"note"})]
    await mesh.peers["bob"].audit.flush()
    rows = audit_rows(mesh.peers["bob"].config.audit_db)
    record = [r for r in rows if r.step_id == "note" and r.reason == "OK"]
    assert [r.payload_size for r in record] == [len(b'{"note":"Audit logs"}')]
    assert all("secret" not in json.dumps(r.to_json_dict()) for r in rows)


async def test_failover_when_a_peer_is_killed(mesh: Mesh) -> None:
    first = await mesh.alice.run(plan(search("a")))
    assert first.steps["a"].where == spiffe("bob")  # discovery is now cached
    await mesh.peers["bob"].stop(grace=0)
    result = await mesh.alice.run(plan(search("a", max_retries=1)))
    assert result.state is PlanTaskState.COMPLETED
    step = result.steps["a"]
    assert (step.where, step.attempts) == (spiffe("carol"), 3)
    assert f"{spiffe('bob')}: PEER_UNAVAILABLE, trying the next route" in step.notes


class LossyAgent(Agent):
    """alice whose first reply from bob is lost after bob has done the work."""

    lost = 0

    def client(self, peer_id: str, address: str | None = None) -> PeerClient:
        real = super().client(peer_id, address)
        agent = self

        class Lossy(PeerClient):
            def __init__(self) -> None:
                self.peer_id, self.address = real.peer_id, real.address

            async def describe(self, *, timeout: float = 5.0) -> Any:
                return await real.describe(timeout=timeout)

            async def invoke(self, capability: str, payload: Any, **kw: Any) -> Any:
                result = await real.invoke(capability, payload, **kw)
                if agent.lost == 0:
                    agent.lost += 1
                    raise PeerUnavailable("connection reset before the reply arrived")
                return result

        return Lossy() if peer_id == spiffe("bob") else real


async def test_retried_write_lands_exactly_once(pki: Pki, mesh: Mesh, tmp_path: Path) -> None:
    lossy = await start_alice(pki, tmp_path / "lossy", list(mesh.peers.values()))
    await lossy.stop(grace=0)
    agent = LossyAgent(lossy.config, alice_registry())
    await agent.start(watch_policy=False)
    try:
        result = await agent.run(
            plan({"id": "w", "capability": "notes.write", "input": {"note": "n"}}, max_risk="write")
        )
    finally:
        await agent.stop(grace=0)
    assert result.state is PlanTaskState.COMPLETED
    step = result.steps["w"]
    assert (step.where, step.attempts, step.remembered) == (spiffe("bob"), 2, True)
    assert mesh.counters["bob"].calls == 1
    assert result.output("w") == {"stored": 1}


async def test_non_transient_refusal_is_not_retried(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(
            {"id": "w", "capability": "notes.write", "input": {"text": "wrong field"}},
            max_risk="write",
        )
    )
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "INVALID_INPUT")
    assert result.steps["w"].attempts == 1
    assert result.message.startswith(f"step 'w' failed on {spiffe('bob')}: ")
    assert mesh.counters["bob"].calls == 0


async def test_deadline_travels_over_two_hops(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(
            {"id": "ask", "capability": "relay.ask", "input": {"peer": spiffe("carol")}},
            budget={"max_elapsed_seconds": 5},
        )
    )
    assert result.state is PlanTaskState.COMPLETED
    out = result.output("ask")
    # Without propagation each hop would get the 30 s default deadline.
    assert 0 < out["remaining"] <= out["hop_remaining"] <= 5
    assert mesh.probes["carol"].remaining == [pytest.approx(out["remaining"], abs=0.5)]


async def test_cancelling_a_task_cancels_the_peer_call(mesh: Mesh) -> None:
    handle = mesh.alice.plans.start(plan({"id": "w", "capability": "slow.wait"}))
    probe = mesh.probes["bob"]
    await asyncio.wait_for(probe.started.wait(), 5)
    handle.cancel()
    result = await handle.result()
    assert (result.state, result.reason) == (PlanTaskState.CANCELLED, "CANCELLED")
    await asyncio.wait_for(probe.cancelled.wait(), 5)
    stored = (await mesh.alice.plans.tasks())[0]
    assert (stored.task_id, stored.state) == (handle.task_id, PlanTaskState.CANCELLED)


async def test_budget_of_peer_calls_is_enforced(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(*(search(f"s{i}") for i in range(4)), max_parallel=1, budget={"max_peer_calls": 2})
    )
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "BUDGET_EXHAUSTED")
    assert result.completed() == ["s0", "s1"]
    assert result.message == "max_peer_calls (2) reached; completed steps: s0, s1"
    assert result.peer_calls == 2


async def test_budget_of_steps_is_enforced(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(*(search(f"s{i}") for i in range(3)), max_parallel=1, budget={"max_steps": 1})
    )
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "BUDGET_EXHAUSTED")
    assert result.completed() == ["s0"]


async def test_ready_steps_run_concurrently_within_max_parallel(mesh: Mesh) -> None:
    result = await mesh.alice.run(
        plan(
            *(search(f"s{i}") for i in range(6)),
            search("last", depends_on=["s0", "s5"]),
            max_parallel=3,
        )
    )
    assert result.state is PlanTaskState.COMPLETED
    assert set(result.completed()) == {f"s{i}" for i in range(6)} | {"last"}
    assert all(s.status is StepStatus.COMPLETED for s in result.steps.values())


async def test_stale_discovery_refusal_is_rerouted_and_recorded(mesh: Mesh) -> None:
    warm = await mesh.alice.run(plan(search("a")))
    assert warm.steps["a"].where == spiffe("bob")
    mesh.peer_policy("bob", [grant("alice", ["text.echo"])])  # bob revokes text.search
    result = await mesh.alice.run(plan(search("a"), search("b", depends_on=["a"])))
    assert result.state is PlanTaskState.COMPLETED
    assert result.steps["a"].where == spiffe("carol")
    assert result.revision == 1
    assert [r.reason for r in result.revisions] == [
        f"step 'a': {spiffe('bob')} answered CAPABILITY_NOT_GRANTED; rerouting away from it"
    ]
    assert result.steps["b"].where == spiffe("carol")  # fresh discovery: bob no longer offers it


@pytest.mark.parametrize(
    ("steps", "extra", "message"),
    [
        ([search("a"), search("a")], {}, "step id 'a' appears more than once"),
        ([search("a", depends_on=["x"])], {}, "step 'a' depends on unknown step 'x'"),
        (
            [search("a", depends_on=["b"]), search("b", depends_on=["a"])],
            {},
            "dependency cycle among steps 'a', 'b'",
        ),
        (
            [
                search("a"),
                {"id": "b", "capability": "text.echo", "input": {"text": {"$from": "a.items"}}},
            ],
            {},
            "step 'b' references 'a.items' but does not depend on 'a'",
        ),
        (
            [{"id": "g", "capability": "kv.get", "input": {"key": "k"}}],
            {},
            "step 'g': no local capability or authorized peer offers kv.get@^9",
        ),
        (
            [{"id": "p", "capability": "kv.delete", "input": {"key": "k"}}],
            {},
            "step 'p': no local capability or authorized peer offers kv.delete@*",
        ),
        (
            [{"id": "w", "capability": "notes.write", "input": {"note": "n"}}],
            {},
            "step 'w': notes.write has risk write; this task allows up to read",
        ),
        ([search(f"s{i}") for i in range(5)], {}, "plan has 5 steps; this agent accepts at most 4"),
    ],
)
async def test_static_checks_refuse_before_anything_runs(
    pki: Pki,
    mesh: Mesh,
    tmp_path: Path,
    steps: list[dict[str, Any]],
    extra: dict[str, Any],
    message: str,
) -> None:
    from gateway.plans import PlanLimits

    if steps[0].get("capability") == "kv.get":
        steps[0]["version"] = "^9"
    agent = await start_alice(
        pki, tmp_path / "strict", list(mesh.peers.values()), plan_limits=PlanLimits(max_steps=4)
    )
    try:
        result = await agent.run(plan(*steps, **extra))
    finally:
        await agent.stop(grace=0)
    assert (result.state, result.reason, result.message) == (
        PlanTaskState.FAILED,
        "PLAN_INVALID",
        message,
    )
    assert result.steps == {}
    for name in PEERS:
        rows = audit_rows(mesh.peers[name].config.audit_db)
        assert all(r.capability != "text.search" or r.task_id != result.task_id for r in rows)


async def test_peer_without_outbound_rule_never_receives_a_step(
    pki: Pki, mesh: Mesh, tmp_path: Path
) -> None:
    registry = alice_registry()
    agent = await start_peer(
        pki, tmp_path / "closed", "alice", registry, [], peers=list(mesh.peers.values())
    )
    try:
        result = await agent.run(plan(search("a")))
    finally:
        await agent.stop(grace=0)
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "PLAN_INVALID")
    for name in PEERS:
        assert all(
            r.capability != "text.search" for r in audit_rows(mesh.peers[name].config.audit_db)
        )


async def test_restarted_agent_resumes_without_rerunning_completed_steps(
    pki: Pki, mesh: Mesh, tmp_path: Path
) -> None:
    work = plan(
        {"id": "w", "capability": "notes.write", "input": {"note": "once"}},
        {"id": "gate", "capability": "slow.wait", "depends_on": ["w"], "input": {"tag": "after-w"}},
        max_risk="write",
    )
    handle = mesh.alice.plans.start(work)
    gate = mesh.probes["bob"]  # slow.wait routes to bob (the first peer allowed)
    await asyncio.wait_for(gate.started.wait(), 5)
    await mesh.alice.stop(grace=0)  # killed mid-task
    stored = await_stored_state(mesh, handle.task_id)
    assert stored in {PlanTaskState.RUNNING.value, PlanTaskState.WAITING_PEER.value}

    gate.release.set()
    restarted = Agent(mesh.alice.config, alice_registry())
    await restarted.start(watch_policy=False)
    mesh.alice = restarted
    result = await restarted.plans.resume(handle.task_id)
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert mesh.counters["bob"].calls == 1  # the write did not run again
    assert result.steps["w"].status is StepStatus.COMPLETED
    assert result.steps["gate"].where == spiffe("bob")
    assert gate.waits == 2  # interrupted once, then run to completion
    again = await restarted.plans.resume(handle.task_id)
    assert again.state is PlanTaskState.COMPLETED and mesh.counters["bob"].calls == 1


def await_stored_state(mesh: Mesh, task_id: str) -> str:
    db = sqlite3.connect(mesh.alice.config.state_dir / "tasks.sqlite")
    try:
        row = db.execute("SELECT state FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    finally:
        db.close()
    return str(row[0])
