"""Probe: CancelTask arriving while a failed run's outcome is being audited.

The capability has already failed and its ``CAPABILITY_FAILED`` record is
committing (``record_durable``, which writes the record even if its caller is
cancelled). A ``CancelTask`` landing in that window must not turn the task into
``CANCELED`` while the audit log says ``CAPABILITY_FAILED``: the task and its
one audit outcome record must tell the same story.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from a2a.types import a2a_pb2

from capabilities.context import CallContext
from capabilities.registry import capability
from gateway.audit import AuditRecord
from tests.helpers.a2a_grpc import A2APeer, data_request
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.task_capabilities import JobInput, JobOutput

BOB = spiffe("bob")


async def test_cancel_while_a_failure_is_audited_leaves_task_and_audit_agreeing(
    pki: Pki, tmp_path: Path
) -> None:
    runs = 0

    @capability("job.fails", "1.0.0", risk="write", timeout=60.0)
    async def fails(inp: JobInput, ctx: CallContext) -> JobOutput:
        nonlocal runs
        runs += 1
        raise RuntimeError("boom")

    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["job.fails"])])
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    registry.register(fails)
    alice = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    committing, hold = asyncio.Event(), asyncio.Event()
    durable = alice.audit.record_durable

    async def slow_commit(rec: AuditRecord) -> None:
        # The record is written whatever happens to the caller (as record_durable
        # promises); the caller just waits a while for the commit.
        written = asyncio.ensure_future(durable(rec))
        if rec.reason == "CAPABILITY_FAILED":
            committing.set()
            await hold.wait()
        await written

    alice.audit.record_durable = slow_commit  # type: ignore[method-assign]
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            request = data_request("job.fails", {"tag": "f"})
            request.configuration.return_immediately = True
            task = await bob.send(request)
            await asyncio.wait_for(committing.wait(), 10)
            cancel = asyncio.ensure_future(
                bob.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
            )
            await asyncio.sleep(0.3)  # the cancel reaches the run mid-commit
            hold.set()
            answered = await asyncio.wait_for(cancel, 10)
            stored = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
        await alice.audit.flush()
        ran: list[Any] = [
            (r.decision, r.reason)
            for r in audit_rows(alice.config.audit_db)
            if r.capability == "job.fails"
        ]
        assert runs == 1
        # One outcome record: the failure, which is what happened.
        assert ran == [("allow", "ADMITTED"), ("allow", "CAPABILITY_FAILED")]
        # ... and the task says the same, on the CancelTask answer and on GetTask.
        for seen in (answered, stored):
            assert seen.status.state == a2a_pb2.TASK_STATE_FAILED
            assert seen.status.message.metadata["a2agw.reason"] == "CAPABILITY_FAILED"
    finally:
        await alice.stop()
