"""Where a run of a checkpointed task starts: what of the stored task it keeps.

A fresh task and a resumed one start the same way, from the checkpoint: its
completed results, the failures an earlier run recorded and was cut off before
answering, its usage (minus the steps parked for an approval), and its down
time. :func:`stored_result` reads a checkpoint as a result without running it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gateway.errors import Cancelled
from gateway.plans.execution.approval import Decision
from gateway.plans.store.records import StoredPlanTask, Usage
from gateway.plans.task import PlanTaskResult, PlanTaskState, StepResult, StepStatus


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """What a run starts from (see :func:`resume_point`).

    Attributes:
        results: Completed results, and the unanswered failures (so neither runs again).
        unanswered: Failures recorded at their step's current revision that the
            run which recorded them did not get to answer, in the order to answer them.
        usage: Budget used so far.
        down_seconds: Time since the last checkpoint that counts against the
            deadline (none while the task waited for a person's decision).
    """

    results: Mapping[str, StepResult]
    unanswered: dict[str, StepResult]
    usage: Usage
    down_seconds: float


def resume_point(stored: StoredPlanTask) -> ResumePoint:
    """Where a run of ``stored`` starts."""
    unanswered = _unanswered_failures(stored)
    results = {sid: r for sid, r in stored.steps.items() if r.status is StepStatus.COMPLETED}
    results.update(unanswered)
    down = (time.time() * 1000 - stored.updated_unix_ms) / 1000
    used = stored.usage
    if stored.state is PlanTaskState.WAITING_APPROVAL:
        down = 0.0  # a person's time to decide is not the task's running time
        used = replace(used, steps=max(0, used.steps - len(_parked_steps(stored))))
    return ResumePoint(results, unanswered, used, down)


def _unanswered_failures(stored: StoredPlanTask) -> dict[str, StepResult]:
    """Failed results at their step's current revision: failures an earlier run
    recorded and was cut off before answering (a revision gives the step a new
    revision; a failure that ended the task left it terminal).

    In plan order, except that steps abandoned (``CANCELLED``) because the task was
    ending come last: the failure that ended it is answered first, as it was.
    """
    failed: list[StepResult] = []
    for step in stored.plan.steps:
        result = stored.steps.get(step.id)
        if result is None or result.status is StepStatus.COMPLETED:
            continue
        if result.revision == step.revision:
            failed.append(result)
    failed.sort(key=lambda result: result.reason == Cancelled.reason)
    return {result.step_id: result for result in failed}


def _parked_steps(stored: StoredPlanTask) -> list[str]:
    """Steps of a task parked in ``waiting-approval`` that asked and never ran.

    The run that parked the task counted each of them when it started them,
    then stopped them before anything was sent (no result is recorded for a
    step that waits); the next run counts them again when it starts them.
    """
    return [step_id for step_id in stored.approvals if step_id not in stored.steps]


def stored_result(stored: StoredPlanTask) -> PlanTaskResult:
    """The result of a task as checkpointed (for finished tasks and listings)."""
    return PlanTaskResult(
        task_id=stored.task_id,
        state=stored.state,
        revision=stored.revision,
        steps=dict(stored.steps),
        reason=stored.reason,
        message=stored.message,
        revisions=stored.revisions,
        peer_calls=stored.usage.peer_calls,
        elapsed_seconds=stored.usage.elapsed_seconds,
        tool_calls=stored.usage.tool_calls,
        approvals=tuple(a for a in stored.approvals.values() if a.decision is Decision.PENDING),
    )
