"""A plan task's life: its state machine and the typed results it produces.

A plan task is one run of a plan; "task" alone means an A2A task.

States::

    created → planning → running ⇄ waiting-peer → completed | failed | cancelled
                            ↓ ↑ (resumed after a decision: planning)
                      waiting-approval

``running`` while a local step (or scheduling) is under way, ``waiting-peer``
while every in-flight step is a call to a peer, ``waiting-approval`` when the
run stopped because a step needs a person's approval (no process runs it; a
decision resumes it). Terminal states never change.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gateway.plans.execution.approval import ApprovalRequest
from gateway.plans.execution.verification import Confidence, weakest


class PlanTaskState(StrEnum):
    """Where a plan task is in its life."""

    CREATED = "created"
    PLANNING = "planning"
    RUNNING = "running"
    WAITING_PEER = "waiting-peer"
    WAITING_APPROVAL = "waiting-approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for completed, failed and cancelled."""
        return self in _TERMINAL


_TERMINAL = frozenset({PlanTaskState.COMPLETED, PlanTaskState.FAILED, PlanTaskState.CANCELLED})
_ENDINGS = _TERMINAL
_NEXT: dict[PlanTaskState, frozenset[PlanTaskState]] = {
    PlanTaskState.CREATED: frozenset({PlanTaskState.PLANNING, PlanTaskState.CANCELLED}),
    PlanTaskState.PLANNING: frozenset({PlanTaskState.RUNNING}) | _ENDINGS,
    PlanTaskState.RUNNING: frozenset(
        {PlanTaskState.WAITING_PEER, PlanTaskState.PLANNING, PlanTaskState.WAITING_APPROVAL}
    )
    | _ENDINGS,
    PlanTaskState.WAITING_PEER: frozenset(
        {PlanTaskState.RUNNING, PlanTaskState.PLANNING, PlanTaskState.WAITING_APPROVAL}
    )
    | _ENDINGS,
    PlanTaskState.WAITING_APPROVAL: frozenset({PlanTaskState.PLANNING}) | _ENDINGS,
    PlanTaskState.COMPLETED: frozenset(),
    PlanTaskState.FAILED: frozenset(),
    PlanTaskState.CANCELLED: frozenset(),
}


class InvalidTransition(ValueError):
    """A state change the machine does not allow (a bug, not a user error)."""


def transition(current: PlanTaskState, new: PlanTaskState) -> PlanTaskState:
    """``new`` if the machine allows ``current → new`` (or they are equal)."""
    if new is not current and new not in _NEXT[current]:
        raise InvalidTransition(f"task cannot go from {current.value} to {new.value}")
    return new


class StepStatus(StrEnum):
    """Outcome of one step."""

    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Evidence:
    """Proof of where and what a step produced.

    Attributes:
        step_id: The step.
        where: ``"local"`` or the peer's SPIFFE ID.
        served_version: Version that served it.
        time_unix_ms: When the answer arrived.
        sha256: Hex SHA-256 of the output bytes (checked against the peer's claim).
    """

    step_id: str
    where: str
    served_version: str
    time_unix_ms: int
    sha256: str


@dataclass(frozen=True, slots=True)
class StepResult:
    """What became of one step.

    Attributes:
        step_id: The step.
        status: completed or failed.
        revision: Step revision it ran under (a result of an older revision is ignored).
        where: Where it ran last (``"local"``, a peer id, or ``""`` if nowhere).
        attempts: Calls made (retries and failovers included).
        duration_ms: Wall time of the step.
        output: The validated output (completed steps only).
        evidence: Evidence of the output (completed steps only).
        remembered: The peer served its stored answer for the idempotency key again
            (stored as ``replayed``; the JSON summary's ``replayed`` too).
        reason: Reason code of the failure (``"OK"`` when completed).
        message: Explanation of the failure (never payload content).
        notes: Routing notes, e.g. peers skipped by policy and why.
        may_have_written: A failed write (risk above ``read``) may have run at ``where``,
            so it must not run anywhere else. Checkpointed as the note that says so
            (``attempt_rules.written_note``), from which a resumed run reads it back.
        confidence: verified, partial or unverified (see ``gateway.plans.execution.verification``).
        sources: Evidence of every source that answered (one for an unverified step).
        candidates: Every distinct output when the sources disagree (else empty).
        asked_verification: The step asked for a quorum or a deterministic check.
    """

    step_id: str
    status: StepStatus
    revision: int
    where: str
    attempts: int
    duration_ms: float
    output: Any = None
    evidence: Evidence | None = None
    remembered: bool = False
    reason: str = "OK"
    message: str = ""
    notes: tuple[str, ...] = ()
    may_have_written: bool = False
    confidence: Confidence = Confidence.UNVERIFIED
    sources: tuple[Evidence, ...] = ()
    candidates: tuple[Any, ...] = ()
    asked_verification: bool = False

    def all_evidence(self) -> tuple[Evidence, ...]:
        """Every source's evidence (the single evidence of an unverified step)."""
        if self.sources:
            return self.sources
        return () if self.evidence is None else (self.evidence,)


@dataclass(frozen=True, slots=True)
class RevisionRecord:
    """One revision of the plan by the planner, and why."""

    revision: int
    reason: str
    time_unix_ms: int


@dataclass(frozen=True, slots=True)
class PlanTaskResult:
    """The typed outcome of running (or resuming) a plan.

    Attributes:
        task_id: The task.
        state: completed, failed or cancelled (or a live state if listed mid-run).
        revision: Plan revision at the end.
        steps: Results by step id (only steps that ran).
        reason: ``"OK"`` or the reason code of what ended the task.
        message: Explanation, including what was completed when it failed.
        revisions: The planner's revisions, oldest first.
        peer_calls: Invoke attempts sent to peers.
        elapsed_seconds: Running time counted against the budget.
        tool_calls: Local capability runs.
        approvals: Approval requests still pending (state ``waiting-approval``).
    """

    task_id: str
    state: PlanTaskState
    revision: int
    steps: dict[str, StepResult]
    reason: str = "OK"
    message: str = ""
    revisions: tuple[RevisionRecord, ...] = field(default=())
    peer_calls: int = 0
    elapsed_seconds: float = 0.0
    tool_calls: int = 0
    approvals: tuple[ApprovalRequest, ...] = ()

    @property
    def confidence(self) -> Confidence:
        """The weakest confidence of the completed steps that asked for verification
        (``unverified`` if none did)."""
        return weakest(
            step.confidence
            for step in self.steps.values()
            if step.asked_verification and step.status is StepStatus.COMPLETED
        )

    @property
    def ok(self) -> bool:
        """True if the task completed."""
        return self.state is PlanTaskState.COMPLETED

    def completed(self) -> list[str]:
        """Ids of completed steps."""
        return [s.step_id for s in self.steps.values() if s.status is StepStatus.COMPLETED]

    def output(self, step_id: str) -> Any:
        """The output of a completed step (KeyError otherwise)."""
        result = self.steps[step_id]
        if result.status is not StepStatus.COMPLETED:
            raise KeyError(step_id)
        return result.output


def __getattr__(name: str) -> Any:
    """``TaskResult``, the name the docs gave ``PlanTaskResult`` before, warns and still imports."""
    if name == "TaskResult":
        warnings.warn(
            "gateway.plans.task.TaskResult is now PlanTaskResult", DeprecationWarning, stacklevel=2
        )
        return PlanTaskResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
