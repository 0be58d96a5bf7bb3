"""When a step may be tried again, and where: the failure classes and a step's progress.

A read (or idempotent) step may be retried on transient failures and moved to
the next route when its peer stays unreachable or silent. A write never moves
once it may have reached a peer: :class:`StepProgress` ``written_at`` records
where, and only an answer whose class says ``nothing_ran`` clears it (the error
tree, ``gateway.errors``, holds what each failure means).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.errors import GatewayError, PayloadTooLarge
from gateway.outbound.router import LOCAL, Offer
from gateway.plans.document.model import Step
from gateway.plans.task import StepResult, StepStatus

ATTEMPT_MARGIN_SECONDS = 1.0
"""Time past a peer's advertised contract timeout for its answer (or its
``CAPABILITY_TIMEOUT``) to arrive before an attempt there is given up."""

WRITE_IN_DOUBT = (
    "the write may have run there and its outcome is unknown, so it is not sent to another peer"
)


def written_note(where: str) -> str:
    """The note a failed result carries when its write may have run at ``where``."""
    return f"{where}: {WRITE_IN_DOUBT}"


@dataclass
class StepProgress:
    """How far one step has got (the executor reads it when it abandons the step).

    Attributes:
        attempts: Calls made so far (retries and failovers included).
        where: Where the latest attempt went.
        notes: Routing notes, e.g. peers skipped by policy and why.
        written_at: Where a write (risk above ``read``) may have run: set when an
            attempt starts, cleared only by an answer that proves nothing ran. The
            step never moves away from it.
        started: When the step started (``time.perf_counter()``).
    """

    attempts: int = 0
    where: str = ""
    notes: list[str] = field(default_factory=list)
    written_at: str = ""
    started: float = field(default_factory=time.perf_counter)

    def elapsed_ms(self) -> float:
        """Milliseconds since the step started."""
        return (time.perf_counter() - self.started) * 1000.0


def attempt_timeout(offer: Offer, remaining: float) -> float:
    """Seconds one attempt at ``offer`` may take when the task has ``remaining`` left."""
    if offer.timeout_seconds is None:
        return remaining
    return min(remaining, offer.timeout_seconds + ATTEMPT_MARGIN_SECONDS)


def may_fail_over(err: GatewayError, offer: Offer, tally: StepProgress) -> bool:
    """True if ``err`` at ``offer`` lets the step move on to the next route."""
    if tally.written_at:  # a write may have run there: only that peer's key protects it
        return False
    # Nothing was sent when the size check refused; an unreachable or silent
    # peer may be replaced only for steps that are safe to repeat.
    if isinstance(err, PayloadTooLarge) and offer.where != LOCAL:
        return True
    return err.transient and offer.retryable


def abandoned_result(step: Step, progress: StepProgress, reason: str, message: str) -> StepResult:
    """The failed result of a step cut off while in flight, saying where it may have written."""
    notes = list(progress.notes)
    if progress.written_at:
        notes.append(written_note(progress.written_at))
    elif progress.where:
        notes.append(f"{progress.where}: abandoned while running there")
    return failed_result(step, progress, reason, message, notes)


def failed_result(
    step: Step, progress: StepProgress, reason: str, message: str, notes: list[str]
) -> StepResult:
    """The failed result of ``step`` as far as ``progress`` got, with ``notes``."""
    return StepResult(
        step_id=step.id,
        status=StepStatus.FAILED,
        revision=step.revision,
        where=progress.where,
        attempts=progress.attempts,
        duration_ms=progress.elapsed_ms(),
        reason=reason,
        message=message,
        notes=tuple(notes),
        may_have_written=bool(progress.written_at),
    )
