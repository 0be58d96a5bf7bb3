"""What a task's checkpoint holds: usage, write pins, approvals, failed attempts, and the
whole stored task."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest
from gateway.plans.store.lease import Lease
from gateway.plans.task import PlanTaskState, RevisionRecord, StepResult


@dataclass(frozen=True, slots=True)
class Usage:
    """Budget consumed so far (survives restarts).

    ``elapsed_seconds`` is as of the checkpoint's ``updated_unix_ms``.
    """

    steps: int = 0
    peer_calls: int = 0
    elapsed_seconds: float = 0.0
    tool_calls: int = 0


@dataclass(frozen=True, slots=True)
class WritePin:
    """Where a write step's attempt went, recorded *before* it is sent.

    A resumed task sends that step only there again, with the same key.

    Attributes:
        step_id: The step.
        revision: Its revision (the key changes with it).
        where: ``"local"`` or the peer's SPIFFE ID.
        idempotency_key: The key the attempt carries.
        version: The version asked for.
        time_unix_ms: When it was recorded.
    """

    step_id: str
    revision: int
    where: str
    idempotency_key: str
    version: str
    time_unix_ms: int


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """An attempt at a step that failed: where it ran and the digest of its input.

    The executor's memory against stagnation (a revision that would repeat it stops
    the task ``STAGNATED``). It holds a digest, never the input itself.

    Attributes:
        step_id: The step.
        where: ``"local"``, the peer's SPIFFE ID, or ``""`` (no route was tried).
        input_sha256: ``comparison_digest`` of the step's resolved input.
    """

    step_id: str
    where: str
    input_sha256: str


@dataclass(frozen=True, slots=True)
class StoredPlanTask:
    """Everything checkpointed about one task."""

    task_id: str
    plan: Plan
    state: PlanTaskState
    revision: int
    reason: str
    message: str
    steps: dict[str, StepResult]
    revisions: tuple[RevisionRecord, ...]
    usage: Usage
    created_unix_ms: int
    updated_unix_ms: int
    pins: dict[str, WritePin] = field(default_factory=dict)
    lease: Lease | None = None
    approvals: dict[str, ApprovalRequest] = field(default_factory=dict)
    """The latest approval request of each step (pending or decided)."""
    failed_attempts: frozenset[FailedAttempt] = frozenset()
    """Every failed attempt of the task, so a resumed run still recognizes a repeat."""
    on_behalf_of: str = ""
    """The subject of the user the task acts for ("" for none); never a token."""
    user_issuer: str = ""
    """The issuer that vouched for that user ("" for none)."""
