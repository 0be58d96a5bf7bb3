"""Bounded replanning: what to do when a step fails after its retries.

A ``Planner`` may revise the remaining plan; the executor caps how often
(``budget.max_revisions``), records each revision with its reason, and never
runs a completed step again. The default, ``RerouteOrStop``, moves the step
away from the peer that failed it, or widens an exact version pin to the
compatible range; otherwise it stops. A write that may have run (``Failure.
may_have_written``) is never revised: a new revision changes its idempotency
key and may send it to another peer, so it could run twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from gateway.errors import error_for_reason
from gateway.outbound.router import LOCAL
from gateway.plans.document.model import Plan, Step


@dataclass(frozen=True, slots=True)
class Failure:
    """A step that failed after its retries.

    Attributes:
        step: The failed step (as it was planned).
        reason: Reason code of the failure.
        where: Where it failed (``"local"``, a peer id, or ``""``).
        may_have_written: A write that may have run at ``where``: it must not run again
            under a new revision (new idempotency key) or anywhere else.
    """

    step: Step
    reason: str
    where: str
    may_have_written: bool


@dataclass(frozen=True, slots=True)
class Revision:
    """A revised plan and why."""

    plan: Plan
    reason: str


class Planner(ABC):
    """Decides whether and how to revise a plan after a step fails."""

    @abstractmethod
    async def revise(
        self, plan: Plan, failure: Failure, completed: frozenset[str], revision: int
    ) -> Revision | None:
        """A new plan for revision ``revision`` (steps changed carry it), or None to stop."""


class RerouteOrStop(Planner):
    """Avoid the failing peer, or relax an exact version pin to ``^``; else stop."""

    async def revise(
        self, plan: Plan, failure: Failure, completed: frozenset[str], revision: int
    ) -> Revision | None:
        step = failure.step
        if failure.may_have_written:
            return None
        if error_for_reason(failure.reason).peer_specific and failure.where not in ("", LOCAL):
            changed = step.model_copy(
                update={"avoid": (*step.avoid, failure.where), "revision": revision}
            )
            return Revision(
                plan.replace_step(changed),
                f"step {step.id!r}: {failure.where} answered {failure.reason}; "
                "rerouting away from it",
            )
        relaxed = _compatible(step.version)
        if error_for_reason(failure.reason).version_specific and relaxed:
            changed = step.model_copy(update={"version": relaxed, "revision": revision})
            return Revision(
                plan.replace_step(changed),
                f"step {step.id!r}: no route for {step.version}; trying compatible {relaxed}",
            )
        return None


def _compatible(constraint: str) -> str | None:
    text = constraint.strip().lstrip("=")
    parts = text.split(".")
    if len(parts) == 3 and all(part.isdigit() for part in parts):
        return f"^{text}"
    return None
