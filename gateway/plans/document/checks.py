"""Static checks on a plan, before anything runs.

Structure (pure): more steps than the cap, duplicate ids, unknown dependency,
dependency cycle, ``$from`` reference to a step that is not a dependency.
Routes (needs the catalog of what is on offer): a capability no local registry
or authorized peer offers, or whose every offer is above the task's risk. A
route is what ``select_routes`` picks, the same function the run-time choice uses.
A step that asks for ``verify`` needs a read or idempotent capability (it runs
on several sources) and at least ``quorum`` distinct places offering it.
Each problem is reported as a PlanInvalid whose message names the step (and
the peers whose Describe refused, with the reason, e.g. an identity mismatch);
but when a peer that might offer it could not be reached, that is not a fault
of the plan: PeerUnavailable, naming the peers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.errors import PeerUnavailable, PlanInvalid
from gateway.outbound.router import Offer, Skipped, select_routes
from gateway.plans.document.model import Plan, Step, reference_step
from gateway.plans.store.lease import LEASE_SECONDS


@dataclass(frozen=True, slots=True)
class PlanLimits:
    """Agent-wide limits on plans.

    Attributes:
        max_steps: Most steps a plan may have.
        default_retries: Retries for a step that does not set ``max_retries``.
        lease_seconds: How long a task's lease lasts unless renewed (renewed every
            third of it while the task runs); see ``gateway.plans.store.lease``.
    """

    max_steps: int = 256
    default_retries: int = 2
    lease_seconds: float = LEASE_SECONDS

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.default_retries < 0 or self.lease_seconds <= 0:
            raise ValueError("max_steps must be >= 1, default_retries >= 0 and lease_seconds > 0")


def check_structure(plan: Plan, limits: PlanLimits) -> None:
    """Run the structural checks (those of ``step_order``).

    Raises:
        PlanInvalid: too many steps, a duplicate id, an unknown or own dependency,
            a cycle, or a ``$from`` reference that is empty or to a step it does
            not depend on.
    """
    step_order(plan, limits)


def step_order(plan: Plan, limits: PlanLimits) -> tuple[str, ...]:
    """The step ids in a dependency order, once the structural checks pass.

    Raises:
        PlanInvalid: as ``check_structure``.
    """
    if len(plan.steps) > limits.max_steps:
        raise PlanInvalid(
            f"plan has {len(plan.steps)} steps; this agent accepts at most {limits.max_steps}"
        )
    ids = _unique_ids(plan.steps)
    for step in plan.steps:
        for dep in step.depends_on:
            if dep not in ids:
                raise PlanInvalid(f"step {step.id!r} depends on unknown step {dep!r}")
            if dep == step.id:
                raise PlanInvalid(f"step {step.id!r} depends on itself")
    order = _topological(plan.steps)
    for step in plan.steps:
        _check_references(step)
    return order


def _unique_ids(steps: Sequence[Step]) -> set[str]:
    seen: set[str] = set()
    for step in steps:
        if step.id in seen:
            raise PlanInvalid(f"step id {step.id!r} appears more than once")
        seen.add(step.id)
    return seen


def _topological(steps: Sequence[Step]) -> tuple[str, ...]:
    waiting = {step.id: set(step.depends_on) for step in steps}
    order: list[str] = []
    while waiting:
        ready = [sid for sid, deps in waiting.items() if not deps]
        if not ready:
            cycle = sorted(waiting)
            raise PlanInvalid(f"dependency cycle among steps {', '.join(map(repr, cycle))}")
        for sid in ready:
            del waiting[sid]
            order.append(sid)
        for deps in waiting.values():
            deps.difference_update(ready)
    return tuple(order)


def _check_references(step: Step) -> None:
    for path in step.references():
        source = reference_step(path)
        if not path or not source:
            raise PlanInvalid(f"step {step.id!r} has an empty $from reference")
        if source not in step.depends_on:
            raise PlanInvalid(
                f"step {step.id!r} references {path!r} but does not depend on {source!r}"
            )


def check_routes(
    plan: Plan,
    catalog: Mapping[str, Sequence[Offer]],
    *,
    skip: frozenset[str] = frozenset(),
    skipped: Mapping[str, Sequence[Skipped]] | None = None,
) -> None:
    """Every step (except ``skip``) has an offer matching its version within the task's risk.

    ``skipped`` holds, by capability, the peers that were not asked what they offer.

    Raises:
        PlanInvalid: a step has no route, or none within the task's risk.
        PeerUnavailable: a step has no route, but peers that might offer it could not
            be reached.
    """
    for step in plan.steps:
        if step.id in skip:
            continue
        offers = catalog.get(step.capability, ())
        matching = select_routes(offers, step.constraint, avoid=step.avoid)
        unreachable = [
            s.where
            for s in (skipped or {}).get(step.capability, ())
            if s.unreachable and s.where not in step.avoid
        ]
        if not matching and unreachable:
            raise PeerUnavailable(
                f"step {step.id!r}: no reachable route offers {step.capability}"
                f"@{step.constraint}; could not reach {', '.join(unreachable)} to ask"
            )
        if not matching:
            raise PlanInvalid(
                f"step {step.id!r}: no local capability or authorized peer offers "
                f"{step.capability}@{step.constraint}{_not_asked(step, skipped)}"
            )
        within = select_routes(offers, step.constraint, avoid=step.avoid, max_risk=plan.max_risk)
        if not within:
            lowest = min(matching, key=lambda offer: offer.risk.rank).risk
            raise PlanInvalid(
                f"step {step.id!r}: {step.capability} has risk {lowest.value}; "
                f"this task allows up to {plan.max_risk.value}"
            )
        if step.verify is not None:
            _check_quorum(step, within, bool(unreachable))


def _not_asked(step: Step, skipped: Mapping[str, Sequence[Skipped]] | None) -> str:
    """The peers whose Describe refused (e.g. ``PEER_IDENTITY_MISMATCH``), as a message tail."""
    refused = [
        f"{s.where} ({s.reason})"
        for s in (skipped or {}).get(step.capability, ())
        if not s.unreachable and s.where not in step.avoid
    ]
    return f"; could not ask {', '.join(refused)}" if refused else ""


def _check_quorum(step: Step, routes: Sequence[Offer], some_unreachable: bool) -> None:
    assert step.verify is not None
    usable = [offer for offer in routes if offer.retryable]
    if not usable:
        raise PlanInvalid(
            f"step {step.id!r}: verify runs a step on several sources, so it needs a read "
            f"or idempotent capability; {step.capability} is neither"
        )
    if len(usable) < step.verify.quorum and not some_unreachable:
        raise PlanInvalid(
            f"step {step.id!r}: verify needs {step.verify.quorum} sources; only "
            f"{len(usable)} (local and authorized peers) offer {step.capability}"
            f"@{step.constraint}"
        )
