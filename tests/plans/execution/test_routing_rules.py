"""Routing rules of plans without a network: discovery failures, attempt deadlines, replanning.

The router gets a fake peer client; everything else is real (policy file, registry).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from capabilities.versions import VersionConstraint
from gateway.errors import (
    DeadlineExceeded,
    PeerUnavailable,
    PlanInvalid,
    UnknownPeer,
)
from gateway.outbound.router import Router, Skipped
from gateway.plans import Plan, PlanLimits, check_routes, parse_plan
from gateway.plans.document.model import Step
from gateway.plans.execution.attempt_rules import (
    ATTEMPT_MARGIN_SECONDS,
    WRITE_IN_DOUBT,
    attempt_timeout,
)
from gateway.plans.execution.driver import PlanDriver
from gateway.plans.execution.executor import ExecutorParts
from gateway.plans.execution.planner import Failure, RerouteOrStop
from gateway.plans.store.sqlite import SqlitePlanTaskStore
from gateway.plans.task import PlanTaskState, StepStatus
from tests.helpers.agents import spiffe
from tests.helpers.fake_peers import BOB, FakePeer, router

ANY = VersionConstraint.parse("")


async def test_advertised_timeout_is_kept_and_bounds_an_attempt(tmp_path: Path) -> None:
    [offer], skipped = await router(tmp_path, FakePeer()).offers("text.search", ANY)
    assert (offer.where, offer.timeout_seconds, skipped) == (BOB, 2.5, [])
    assert attempt_timeout(offer, 60.0) == 2.5 + ATTEMPT_MARGIN_SECONDS
    assert attempt_timeout(offer, 1.0) == 1.0  # never past the task's deadline


async def test_unreachable_peer_is_skipped_and_remembered_briefly(tmp_path: Path) -> None:
    peer = FakePeer(PeerUnavailable("connection refused"))
    routes = router(tmp_path, peer)
    for _ in range(2):
        assert await routes.offers("text.search", ANY) == ([], [Skipped(BOB, "PEER_UNAVAILABLE")])
        offers, skipped = await routes.catalog(["text.search"])
        assert (offers, skipped) == ({"text.search": []}, {"text.search": skipped["text.search"]})
        assert skipped["text.search"][0].unreachable
    assert len(peer.timeouts) == 1  # asked once, then remembered
    routes.forget(BOB)
    peer.error = None
    offers, skipped = await routes.offers("text.search", ANY)
    assert ([o.where for o in offers], skipped) == ([BOB], [])


async def test_describe_waits_no_longer_than_the_deadline(tmp_path: Path) -> None:
    peer = FakePeer(DeadlineExceeded("no answer"))
    routes = router(tmp_path, peer, describe_timeout=3.0)
    _, skipped = await routes.offers("text.search", ANY, deadline=time.monotonic() + 0.5)
    assert skipped == [Skipped(BOB, "PEER_UNAVAILABLE")]
    assert 0 < peer.timeouts[0] <= 0.5
    # Cut short by the caller's deadline, not by the peer: not remembered.
    await routes.offers("text.search", ANY)
    assert peer.timeouts[1:] == [3.0]
    _, skipped = await routes.offers("text.search", ANY, deadline=time.monotonic() - 1)
    assert skipped == [Skipped(BOB, "PEER_UNAVAILABLE")] and len(peer.timeouts) == 2


async def test_a_refused_describe_is_named_not_remembered(tmp_path: Path) -> None:
    peer = FakePeer(UnknownPeer("who?"))
    routes = router(tmp_path, peer)
    for _ in range(2):
        assert await routes.offers("text.search", ANY) == ([], [Skipped(BOB, "UNKNOWN_PEER")])
    assert len(peer.timeouts) == 2


def one_step_plan(capability: str = "text.search") -> Any:
    return parse_plan(f'{{"goal": "g", "steps": [{{"id": "r", "capability": "{capability}"}}]}}')


def test_no_route_because_a_peer_was_unreachable_is_not_an_invalid_plan() -> None:
    with pytest.raises(PeerUnavailable) as info:
        check_routes(
            one_step_plan(), {}, skipped={"text.search": [Skipped(BOB, "PEER_UNAVAILABLE")]}
        )
    assert info.value.message == (
        f"step 'r': no reachable route offers text.search@*; could not reach {BOB} to ask"
    )
    with pytest.raises(PlanInvalid):  # a refusal is an answer: the plan has no route
        check_routes(one_step_plan(), {}, skipped={"text.search": [Skipped(BOB, "UNKNOWN_PEER")]})


@pytest.mark.parametrize(
    "reason", ["INVALID_OUTPUT", "CAPABILITY_FAILED", "CAPABILITY_NOT_GRANTED"]
)
async def test_planner_never_revises_a_write_that_may_have_run(reason: str) -> None:
    plan = one_step_plan()
    step: Step = plan.steps[0]
    planner = RerouteOrStop()
    assert await planner.revise(plan, Failure(step, reason, BOB, True), frozenset(), 1) is None
    revised = await planner.revise(plan, Failure(step, reason, BOB, False), frozenset(), 1)
    assert revised is not None and revised.plan.steps[0].avoid == (BOB,)


class SilentRouter(Router):
    """Sends into the void: the call never returns, whatever its timeout."""

    async def send(self, *args: Any, **kw: Any) -> Any:
        await asyncio.Event().wait()


async def test_write_in_flight_when_the_budget_ends_is_recorded_with_its_peer(
    tmp_path: Path,
) -> None:
    store = SqlitePlanTaskStore(tmp_path / "tasks.sqlite")
    parts = ExecutorParts(
        agent_id=spiffe("alice"),
        router=router(tmp_path, FakePeer(risk="write"), SilentRouter),
        store=store,
        planner=RerouteOrStop(),
        limits=PlanLimits(),
    )
    plan = Plan.model_validate(
        {
            "goal": "g",
            "max_risk": "write",
            "budget": {"max_elapsed_seconds": 0.3},
            "steps": [{"id": "w", "capability": "text.search", "input": {"q": 1}}],
        }
    )
    try:
        result = await asyncio.wait_for(PlanDriver(parts).run(plan), 10)
        stored = await store.load(result.task_id)
    finally:
        store.close()
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "BUDGET_EXHAUSTED")
    w = result.steps["w"]
    assert (w.status, w.where, w.attempts, w.reason) == (
        StepStatus.FAILED,
        BOB,
        1,
        "BUDGET_EXHAUSTED",
    )
    assert w.may_have_written and w.notes == (f"{BOB}: {WRITE_IN_DOUBT}",)
    assert stored.steps["w"].notes == w.notes and stored.steps["w"].where == BOB
