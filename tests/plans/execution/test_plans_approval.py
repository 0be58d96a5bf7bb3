"""Steps that ask before they act, and replans that would repeat a failure, over real agents.

bob and carol serve the counting ``fault.*`` capabilities; alice may send them all to
both (bob first). A ``fault.write`` step above the approval risk waits: nothing is sent
until a decision, which is audited in alice's log, survives a restart of alice, and
binds to the exact step, peer, version and input digest. A revision that would repeat
a failed attempt stops the task ``STAGNATED``, also after alice restarted or waited
for a decision in between (the failed attempts are checkpointed with the task), and a
failure recorded just before alice stopped is answered by the resumed run, not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from capabilities.contract import Risk
from capabilities.registry import CapabilityRegistry
from gateway.config import PlanSettings
from gateway.errors import TaskNotFound
from gateway.plans import Plan
from gateway.plans.execution.approval import Decision
from gateway.plans.execution.planner import Failure, Planner, Revision
from gateway.plans.task import PlanTaskResult, PlanTaskState, RevisionRecord
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    agent_config,
    audit_rows,
    grant,
    outbound_rule,
    spiffe,
    start_peer,
    write_policy,
)
from tests.helpers.plan_capabilities import FaultyPeer, faulty_registry

FAULT_CAPS = ["fault.read", "fault.glance", "fault.write", "fault.brief", "fault.append"]
BOB, CAROL = spiffe("bob"), spiffe("carol")


@dataclass
class Scene:
    pki: Pki
    base: Path
    faults: dict[str, FaultyPeer]
    peers: list[Agent]
    alice: Agent
    stores: dict[str, str] = field(default_factory=dict)
    """alice's audit_db/state_db from the next restart on ({}: SQLite in her state dir)."""

    def runs(self, capability: str) -> int:
        return sum(peer.total(capability) for peer in self.faults.values())

    def writes(self) -> dict[str, int]:
        """Runs of ``fault.write`` on each peer."""
        return {name: peer.total("fault.write") for name, peer in self.faults.items()}

    async def restart_alice(self, **kw: Any) -> Agent:
        """A new alice process-equivalent on the same state dir and audit log."""
        await self.alice.stop(grace=0)
        self.alice = await start_alice(self.pki, self.base, self.peers, stores=self.stores, **kw)
        return self.alice


async def start_alice(
    pki: Pki,
    base: Path,
    peers: list[Agent],
    *,
    planner: Planner | None = None,
    approval_min_risk: Risk | None = None,
    stores: dict[str, str] | None = None,
) -> Agent:
    outbound = [outbound_rule(name, FAULT_CAPS) for name in ("bob", "carol")]
    policy = write_policy(base / "alice-policy.toml", [], outbound)
    addresses = [(p.config.id, p.address) for p in peers]
    config = agent_config(pki, base, "alice", policy, addresses, stores=stores)
    config = config.model_copy(update={"plans": PlanSettings(approval_min_risk=approval_min_risk)})
    agent = Agent(config, CapabilityRegistry(), planner=planner)
    await agent.start(watch_policy=False)
    return agent


@pytest.fixture
async def scene(pki: Pki, tmp_path: Path) -> AsyncIterator[Scene]:
    faults = {"bob": FaultyPeer(), "carol": FaultyPeer()}
    peers: list[Agent] = []
    for name in ("bob", "carol"):
        registry = faulty_registry(faults[name])
        peers.append(await start_peer(pki, tmp_path, name, registry, [grant("alice", FAULT_CAPS)]))
    scene = Scene(pki, tmp_path, faults, peers, await start_alice(pki, tmp_path, peers))
    yield scene
    for agent in (scene.alice, *peers):
        await agent.stop(grace=0)


def plan(*steps: dict[str, Any], **extra: Any) -> Plan:
    document = {"goal": "approve", "max_risk": "write", "budget": {"max_elapsed_seconds": 20}}
    return Plan.model_validate({**document, **extra, "steps": list(steps)})


def guarded(key: Any = "k", **extra: Any) -> Plan:
    """``first`` (a read) → ``put`` (an idempotent write of ``key``) needing approval."""
    return plan(
        {"id": "first", "capability": "fault.read", "input": {"key": "r"}},
        {"id": "put", "capability": "fault.write", "depends_on": ["first"], "input": {"key": key}},
        approval={"min_risk": "write"},
        **extra,
    )


def digest_of(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


async def test_pause_restart_approve_completes_with_one_write(scene: Scene) -> None:
    waiting = await scene.alice.run(guarded(key={"$from": "first.key"}))
    assert (waiting.state, waiting.reason) == (PlanTaskState.WAITING_APPROVAL, "OK")
    assert scene.runs("fault.write") == 0 and scene.runs("fault.read") == 1
    [request] = waiting.approvals
    assert (request.step_id, request.capability, request.where, request.version) == (
        "put",
        "fault.write",
        BOB,
        "1.0.0",
    )
    assert request.fields == {"key": len(b'"r"')}
    assert request.input_sha256 == digest_of(b'{"key":"r"}')
    assert (
        await scene.alice.plan_tasks.load(waiting.task_id)
    ).state is PlanTaskState.WAITING_APPROVAL

    alice = await scene.restart_alice()
    decided = await alice.plans.decide(waiting.task_id, "put", approve=True)
    assert decided.decision is Decision.APPROVED
    result = await alice.plans.resume(waiting.task_id)
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert scene.runs("fault.write") == 1 and scene.runs("fault.read") == 1
    await alice.audit.flush()
    [row] = [r for r in audit_rows(alice.config.audit_db) if r.step_id == "put"]
    assert (row.reason, row.decision, row.task_id) == ("APPROVED", "allow", waiting.task_id)
    assert row.payload_sha256 == request.input_sha256
    assert f"pid {__import__('os').getpid()}" in row.detail and BOB in row.detail
    assert '"r"' not in row.detail


async def test_deny_fails_the_step_and_nothing_is_written(scene: Scene) -> None:
    waiting = await scene.alice.run(guarded())
    await scene.alice.plans.decide(waiting.task_id, "put", approve=False)
    result = await scene.alice.plans.resume(waiting.task_id)
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "APPROVAL_DENIED")
    assert "step 'put'" in result.message and "completed steps: first" in result.message
    assert scene.runs("fault.write") == 0
    await scene.alice.audit.flush()
    [row] = [r for r in audit_rows(scene.alice.config.audit_db) if r.step_id == "put"]
    assert (row.reason, row.decision) == ("APPROVAL_DENIED", "refuse")
    with pytest.raises(TaskNotFound):  # nothing waits any more
        await scene.alice.plans.decide(waiting.task_id, "put", approve=True)


async def test_a_changed_input_after_approval_asks_again(scene: Scene) -> None:
    waiting = await scene.alice.run(guarded(key="old"))
    approved = await scene.alice.plans.decide(waiting.task_id, "put", approve=True)
    # A revision changes what the step would send (as a replan whose $from resolves
    # differently would); the approval was for the old input only.
    stored = await scene.alice.plan_tasks.load(waiting.task_id)
    changed = stored.plan.step("put").model_copy(update={"input": {"key": "new"}, "revision": 1})
    record = RevisionRecord(1, "input changed", int(time.time() * 1000))
    await scene.alice.plan_tasks.revise(waiting.task_id, stored.plan.replace_step(changed), record)

    again = await scene.alice.plans.resume(waiting.task_id)
    assert again.state is PlanTaskState.WAITING_APPROVAL
    [request] = again.approvals
    assert request.input_sha256 == digest_of(b'{"key":"new"}') != approved.input_sha256
    assert scene.runs("fault.write") == 0
    await scene.alice.plans.decide(waiting.task_id, "put", approve=True)
    result = await scene.alice.plans.resume(waiting.task_id)
    assert result.state is PlanTaskState.COMPLETED and scene.runs("fault.write") == 1


async def test_agent_policy_makes_approval_mandatory(scene: Scene) -> None:
    alice = await scene.restart_alice(approval_min_risk=Risk.WRITE)
    unguarded = plan({"id": "put", "capability": "fault.write", "input": {"key": "k"}})
    result = await alice.run(unguarded)
    assert result.state is PlanTaskState.WAITING_APPROVAL
    assert [a.step_id for a in result.approvals] == ["put"]
    assert scene.runs("fault.write") == 0


async def test_reads_below_the_approval_risk_do_not_wait(scene: Scene) -> None:
    result = await scene.alice.run(
        plan(
            {"id": "first", "capability": "fault.read", "input": {"key": "r"}},
            approval={"min_risk": "write"},
        )
    )
    assert (result.state, result.approvals) == (PlanTaskState.COMPLETED, ())


async def test_verify_of_a_write_needing_approval_is_refused_before_sending(scene: Scene) -> None:
    step = {"id": "put", "capability": "fault.write", "input": {"key": "k"}}
    result = await scene.alice.run(
        plan({**step, "verify": {"quorum": 2}}, approval={"min_risk": "write"})
    )
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "PLAN_INVALID")
    assert "step 'put': verify cannot run a step that needs approval" in result.message
    assert scene.runs("fault.write") == 0 and result.approvals == ()


class SameAgain(Planner):
    """A planner that 'revises' a failed step into the very same step."""

    async def revise(
        self, plan: Plan, failure: Failure, completed: frozenset[str], revision: int
    ) -> Revision | None:
        same = failure.step.model_copy(update={"revision": revision})
        return Revision(plan.replace_step(same), "try the same again")


async def test_a_replan_repeating_a_failed_attempt_stagnates(scene: Scene) -> None:
    alice = await scene.restart_alice(planner=SameAgain())
    scene.faults["bob"].modes["fault.read"] = "invalid"
    result = await alice.run(plan({"id": "r", "capability": "fault.read", "input": {"key": "k"}}))
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "STAGNATED")
    assert f"step 'r': the revised plan would run it on {BOB}" in result.message
    assert scene.faults["bob"].total("fault.read") == 1  # the repeat was never sent
    assert result.revisions == ()


async def test_resumes_while_waiting_do_not_spend_the_step_budget(scene: Scene) -> None:
    # Two steps, max_steps 2: a step that waits for a person sent nothing, so
    # resuming before the decision must not count it again each time.
    waiting = await scene.alice.run(guarded(budget={"max_elapsed_seconds": 20, "max_steps": 2}))
    assert waiting.state is PlanTaskState.WAITING_APPROVAL
    for _ in range(3):
        again = await scene.alice.plans.resume(waiting.task_id)
        assert (again.state, again.reason) == (PlanTaskState.WAITING_APPROVAL, "OK")
    alice = await scene.restart_alice()
    await alice.plans.decide(waiting.task_id, "put", approve=True)
    result = await alice.plans.resume(waiting.task_id)
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert scene.runs("fault.write") == 1 and scene.runs("fault.read") == 1
    assert (await alice.plan_tasks.load(waiting.task_id)).usage.steps == 2


class BackAndForth(Planner):
    """Moves a failed step away from bob; once it failed elsewhere too, back to bob
    with the same input: a repeat of the attempt that failed on bob."""

    async def revise(
        self, plan: Plan, failure: Failure, completed: frozenset[str], revision: int
    ) -> Revision | None:
        avoid = (BOB,) if failure.where == BOB else ()
        moved = failure.step.model_copy(update={"avoid": avoid, "revision": revision})
        return Revision(plan.replace_step(moved), f"step {failure.step.id!r}: avoid {avoid}")


PUT = {"id": "put", "capability": "fault.write", "input": {"key": "k"}}
REPEAT = (
    f"step 'put': the revised plan would run it on {BOB} with the same input as an "
    "attempt that already failed"
)


async def test_a_restarted_agent_does_not_repeat_a_failed_write(
    scene: Scene, stores: dict[str, str]
) -> None:
    scene.stores = stores
    alice = await scene.restart_alice(planner=BackAndForth())
    scene.faults["bob"].modes["fault.write"] = "invalid"  # it ran, its answer is unusable
    scene.faults["carol"].modes["fault.write"] = "hang"
    handle = alice.plans.start(plan(PUT))
    await asyncio.wait_for(scene.faults["carol"].started.wait(), 30)  # a hang detector only
    assert scene.writes() == {"bob": 1, "carol": 1}  # revision 1 moved it to carol

    alice = await scene.restart_alice(planner=BackAndForth())  # the task stays resumable
    result = await alice.plans.resume(handle.task_id)
    # carol answers the pinned retry IDEMPOTENCY_IN_DOUBT (her run was cut off), and the
    # planner sends the step back to bob with the input that already failed there.
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "STAGNATED")
    assert result.message == f"{REPEAT}; completed steps: none"
    assert scene.writes() == {"bob": 1, "carol": 1}  # nothing ran again, anywhere
    assert [r.revision for r in result.revisions] == [1]
    put = result.steps["put"]
    assert (put.where, put.reason) == (spiffe("carol"), "IDEMPOTENCY_IN_DOUBT")


async def test_a_task_that_waited_for_approval_does_not_repeat_a_failed_write(
    scene: Scene,
) -> None:
    alice = await scene.restart_alice(planner=BackAndForth())
    scene.faults["bob"].modes["fault.write"] = "invalid"
    scene.faults["carol"].modes["fault.write"] = "invalid"
    task_id = (await alice.run(plan(PUT, approval={"min_risk": "write"}))).task_id
    await alice.plans.decide(task_id, "put", approve=True)
    moved = await alice.plans.resume(task_id)  # fails on bob; revision 1 asks for carol
    assert moved.state is PlanTaskState.WAITING_APPROVAL
    assert [a.where for a in moved.approvals] == [spiffe("carol")]
    assert scene.writes() == {"bob": 1, "carol": 0}

    alice = await scene.restart_alice(planner=BackAndForth())
    await alice.plans.decide(task_id, "put", approve=True)
    result = await alice.plans.resume(task_id)  # fails on carol; revision 2 would be bob
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "STAGNATED")
    assert result.message == f"{REPEAT}; completed steps: none"
    assert scene.writes() == {"bob": 1, "carol": 1}
    assert result.approvals == ()  # nobody is asked to approve the repeat


async def test_a_task_store_from_before_failed_attempts_resumes(scene: Scene) -> None:
    waiting = await scene.alice.run(guarded())
    assert waiting.state is PlanTaskState.WAITING_APPROVAL
    await scene.alice.stop(grace=0)
    path = scene.alice.config.state_dir / "tasks.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:  # as the release before left it
        db.execute("DROP TABLE failed_attempts")
    alice = await scene.restart_alice()
    assert (await alice.plan_tasks.load(waiting.task_id)).failed_attempts == frozenset()
    await alice.plans.decide(waiting.task_id, "put", approve=True)
    result = await alice.plans.resume(waiting.task_id)
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert scene.runs("fault.write") == 1 and scene.runs("fault.read") == 1


class StopsWhileRevising(Planner):
    """A planner asked to revise that never answers: the agent is stopped meanwhile, with
    the step's failure checkpointed and no revision or ending that answers it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def revise(
        self, plan: Plan, failure: Failure, completed: frozenset[str], revision: int
    ) -> Revision | None:
        self.asked.set()
        await asyncio.Event().wait()
        return None


async def test_a_failure_recorded_before_a_restart_is_answered_not_run_again(
    scene: Scene, stores: dict[str, str]
) -> None:
    scene.stores = stores
    stopping = StopsWhileRevising()
    alice = await scene.restart_alice(planner=stopping)
    scene.faults["bob"].modes["fault.read"] = "invalid"
    handle = alice.plans.start(plan({"id": "r", "capability": "fault.read", "input": {"key": "k"}}))
    await asyncio.wait_for(stopping.asked.wait(), 30)  # a hang detector only
    assert scene.faults["bob"].total("fault.read") == 1

    alice = await scene.restart_alice(planner=SameAgain())
    result = await alice.plans.resume(handle.task_id)
    # As test_a_replan_repeating_a_failed_attempt_stagnates, run without the restart:
    # the planner's repeat stops the task, and bob is not asked again.
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "STAGNATED")
    assert result.message == (
        f"step 'r': the revised plan would run it on {BOB} with the same input as an "
        "attempt that already failed; completed steps: none"
    )
    assert scene.faults["bob"].total("fault.read") == 1
    assert scene.faults["carol"].total("fault.read") == 0
    assert result.revisions == () and result.peer_calls == 1
    r = result.steps["r"]
    assert (r.where, r.reason, r.attempts) == (BOB, "INVALID_OUTPUT", 1)


def summary(result: PlanTaskResult) -> tuple[object, ...]:
    """What must not depend on a restart in between (ids and times left out)."""
    steps = {
        sid: (r.status, r.revision, r.where, r.attempts, r.reason, r.message, r.notes)
        for sid, r in result.steps.items()
    }
    revisions = [r.reason for r in result.revisions]
    return (result.state, result.reason, result.message, revisions, result.peer_calls, steps)


async def test_a_recorded_failure_whose_revision_has_no_route_ends_as_without_a_restart(
    scene: Scene, stores: dict[str, str]
) -> None:
    # Only bob may run it; his answer is unusable, so the planner moves it away from
    # bob, to nowhere: the revised step fails NO_ROUTE when it runs.
    scene.stores = stores
    alice = await scene.restart_alice()
    scene.faults["bob"].modes["fault.read"] = "invalid"
    step = {"id": "r", "capability": "fault.read", "input": {"key": "k"}, "avoid": [CAROL]}
    uninterrupted = await alice.run(plan(step))
    assert (uninterrupted.state, uninterrupted.reason) == (PlanTaskState.FAILED, "NO_ROUTE")
    assert uninterrupted.message.startswith("step 'r' failed: no local capability or ")

    stopping = StopsWhileRevising()
    alice = await scene.restart_alice(planner=stopping)
    handle = alice.plans.start(plan(step))
    await asyncio.wait_for(stopping.asked.wait(), 30)  # a hang detector only
    alice = await scene.restart_alice()
    resumed = await alice.plans.resume(handle.task_id)

    assert summary(resumed) == summary(uninterrupted)
    assert scene.faults["bob"].total("fault.read") == 2  # once for each task
    assert scene.faults["carol"].total("fault.read") == 0
