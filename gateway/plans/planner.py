"""Bounded replanning: what to do when a step fails after its retries.

A ``Planner`` may revise the remaining plan; the executor caps how often
(``budget.max_revisions``), records each revision with its reason, and never
runs a completed step again. The default, ``RerouteOrStop``, moves the step
away from the peer that failed it, or widens an exact version pin to the
compatible range; otherwise it stops.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from gateway.errors import (
    CapabilityFailed,
    CapabilityNotGranted,
    ExpectationFailed,
    InvalidOutput,
    NoRoute,
    OutputTooLarge,
    PayloadTooLarge,
    PolicyRefusal,
    VersionNotAvailable,
)
from gateway.plans.model import Plan, Step
from gateway.router import LOCAL

REROUTABLE = frozenset(
    cls.reason
    for cls in (
        PolicyRefusal,
        CapabilityNotGranted,
        VersionNotAvailable,
        PayloadTooLarge,
        OutputTooLarge,
        InvalidOutput,
        CapabilityFailed,
        ExpectationFailed,
    )
) | {"UNKNOWN_PEER", "GRANT_EXPIRED", "RISK_NOT_GRANTED", "OUTBOUND_NOT_ALLOWED"}
"""Failures another peer might not have: refusals (nothing ran) and unusable answers.

An unreachable peer is not here: the executor already failed over for steps
that are safe to repeat, and for the others the write may have happened.
"""


@dataclass(frozen=True, slots=True)
class Failure:
    """A step that failed after its retries.

    Attributes:
        step: The failed step (as it was planned).
        reason: Reason code of the failure.
        where: Where it failed (``"local"``, a peer id, or ``""``).
    """

    step: Step
    reason: str
    where: str


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
        if failure.reason in REROUTABLE and failure.where and failure.where != LOCAL:
            changed = step.model_copy(
                update={"avoid": (*step.avoid, failure.where), "revision": revision}
            )
            return Revision(
                plan.replace_step(changed),
                f"step {step.id!r}: {failure.where} answered {failure.reason}; "
                "rerouting away from it",
            )
        relaxed = _compatible(step.version)
        if failure.reason in {NoRoute.reason, VersionNotAvailable.reason} and relaxed:
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
