"""A plan step an agent runs itself is audited like any call (docs/plans.md).

One agent, no peers: a local read gets one ``OK`` record; a local write gets its
write-ahead ``ADMITTED`` record before it runs and its outcome after; a local
step that fails is recorded with the failure's reason. Every record names the
task and step, the agent itself as the peer, and holds no payload content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from capabilities import CallContext, ContractModel, capability
from capabilities.builtin.echo import echo
from capabilities.registry import CapabilityRegistry
from gateway.outbound.router import encode_payload
from gateway.plans import Plan
from gateway.plans.execution.local_step_audit import LOCAL_STEP_DETAIL
from gateway.plans.task import PlanTaskState
from tests.helpers.agents import Pki, WriteCounter, audit_rows, spiffe, start_peer


class Nothing(ContractModel):
    pass


@capability("always.fails", "1.0.0", risk="read", timeout=2.0, idempotent=True)
async def always_fails(inp: Nothing, ctx: CallContext) -> Nothing:
    """Raise, so the step fails CAPABILITY_FAILED."""
    raise RuntimeError("secret failure text")


def registry(counter: WriteCounter) -> CapabilityRegistry:
    found = CapabilityRegistry()
    found.register(echo)
    found.register(counter.capability())
    found.register(always_fails)
    return found


async def test_local_steps_are_audited_like_calls(pki: Pki, tmp_path: Path) -> None:
    counter = WriteCounter()
    alice = await start_peer(pki, tmp_path, "alice", registry(counter), [])
    try:
        plan = Plan.model_validate(
            {
                "goal": "secret goal",
                "max_risk": "write",
                "steps": [
                    {"id": "say", "capability": "text.echo", "input": {"text": "secret words"}},
                    {
                        "id": "note",
                        "capability": "notes.write",
                        "depends_on": ["say"],
                        "input": {"note": "secret body"},
                    },
                ],
            }
        )
        result = await alice.run(plan)
        assert (result.state, counter.calls) == (PlanTaskState.COMPLETED, 1)
        failing = await alice.run(
            Plan.model_validate(
                {"goal": "g", "steps": [{"id": "x", "capability": "always.fails", "input": {}}]}
            )
        )
        assert failing.state is PlanTaskState.FAILED
        await alice.audit.flush()
    finally:
        await alice.stop(grace=0)
    records = [r for r in audit_rows(alice.config.audit_db) if r.detail == LOCAL_STEP_DETAIL]
    seen = [(r.task_id, r.step_id, r.capability, r.reason) for r in records]
    assert seen == [
        (result.task_id, "say", "text.echo", "OK"),
        (result.task_id, "note", "notes.write", "ADMITTED"),
        (result.task_id, "note", "notes.write", "OK"),
        (failing.task_id, "x", "always.fails", "CAPABILITY_FAILED"),
    ]
    assert {(r.peer_id, r.decision, r.served_version) for r in records} == {
        (spiffe("alice"), "allow", "1.0.0")
    }
    said = encode_payload({"text": "secret words"})
    assert (records[0].payload_size, records[0].payload_sha256) == (
        len(said),
        hashlib.sha256(said).hexdigest(),
    )
    stored = json.dumps([dataclasses.asdict(r) for r in audit_rows(alice.config.audit_db)])
    assert "secret" not in stored
