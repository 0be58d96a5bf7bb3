"""A2A task rows for the task store tests: three owners, and a task of each number."""

from __future__ import annotations

from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome
from tests.helpers.a2a_grpc import a2a_task

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"
CAROL = "spiffe://example.org/agent/carol"
SECRET = b'{"text": "payload-never-logged"}'


def task(
    n: int,
    owner: str = BOB,
    *,
    context_id: str = "ctx-a",
    state: TaskOutcome = TaskOutcome.COMPLETED,
) -> A2ATask:
    return a2a_task(
        f"task-{n}",
        owner,
        "text.echo",
        context_id=context_id,
        state=state,
        output=SECRET if state is TaskOutcome.COMPLETED else b"",
        evidence_sha256="ab" * 32,
        remembered=n % 2 == 1,
        reason="OK" if state is TaskOutcome.COMPLETED else "CAPABILITY_FAILED",
        message="" if state is TaskOutcome.COMPLETED else "it failed",
        created_ms=1_000 + n,
        updated_ms=2_000 + n,
    )
