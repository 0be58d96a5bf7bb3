"""Task leases, write pins and usage checkpoints in the task store, and what the runner
does with them: one process per task, fenced checkpoints, budgets that survive a crash.

Real SQLite files; the router gets a fake peer client (see test_routing_rules).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import InvokeResult
from gateway.errors import TaskLeased
from gateway.local.process_owner import holder_gone
from gateway.outbound.router import Router
from gateway.plans import Plan, PlanLimits
from gateway.plans.execution.attempt_rules import WRITE_IN_DOUBT
from gateway.plans.execution.driver import PlanDriver
from gateway.plans.execution.executor import ExecutorParts
from gateway.plans.execution.planner import RerouteOrStop
from gateway.plans.store.lease import Lease, may_take
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.sqlite import SqlitePlanTaskStore, Usage, WritePin
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import PlanTaskState, StepResult, StepStatus
from policies.store import PolicyStore
from tests.helpers.agents import WriteCounter, outbound_rule, spiffe, write_policy
from tests.helpers.fake_peers import BOB, FakePeer, router
from tests.helpers.postgres import state_pool

WAIT = 10.0  # bound on any wait (a hang detector, never asserted)
PLAN = Plan.model_validate(
    {
        "goal": "g",
        "budget": {"max_elapsed_seconds": 5, "max_peer_calls": 3},
        "steps": [{"id": "r", "capability": "text.search", "input": {"q": 1}}],
    }
)


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The lease rules hold for both task stores."""
    opened: PlanTaskStore
    if request.param == "sqlite":
        opened = SqlitePlanTaskStore(tmp_path / "tasks.sqlite")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        opened = PostgresPlanTaskStore(
            state_pool(dsn, "task store"), "spiffe://example.org/agent/alice"
        )
    yield opened
    opened.close()


# --- The lease in the store -------------------------------------------------------------------


async def test_live_lease_refuses_a_second_owner_until_it_expires(
    store: SqlitePlanTaskStore,
) -> None:
    await store.create("t1", PLAN, 1000)
    await store.take_lease("t1", "other-host:1:a", 1000, 30.0)
    with pytest.raises(TaskLeased) as refused:
        await store.take_lease("t1", "other-host:2:b", 30_999, 30.0)
    assert refused.value.reason == "TASK_LEASED"
    assert "other-host:1:a" in refused.value.message
    await store.take_lease("t1", "other-host:1:a", 2000, 30.0)  # the holder renews by taking
    await store.take_lease("t1", "other-host:2:b", 32_000, 30.0)  # expired: taken over
    assert (await store.load("t1")).lease == Lease("other-host:2:b", 62_000)
    assert not await store.renew_lease("t1", "other-host:1:a", 32_001, 30.0)
    await store.release_lease("t1", "other-host:1:a")  # not the holder: nothing happens
    assert (await store.load("t1")).lease == Lease("other-host:2:b", 62_000)
    await store.release_lease("t1", "other-host:2:b")
    assert (await store.load("t1")).lease is None


async def test_lease_of_a_dead_process_on_this_host_can_be_taken_at_once(
    store: SqlitePlanTaskStore,
) -> None:
    host = socket.gethostname()
    gone = f"{host}:{dead_pid()}:x"
    alive = f"{host}:{subprocess.os.getppid()}:y"  # type: ignore[attr-defined]
    assert holder_gone(gone) and not holder_gone(alive)
    assert not holder_gone(f"elsewhere:{dead_pid()}:z")  # another host: wait for the expiry
    assert not holder_gone("not an owner id")
    assert may_take(Lease(gone, 10**15), "me", 0)
    assert not may_take(Lease(alive, 10**15), "me", 0)
    await store.create("t1", PLAN, 1000)
    await store.take_lease("t1", gone, 1000, 30.0)
    await store.take_lease("t1", "me", 1001, 30.0)
    assert (await store.load("t1")).lease == Lease("me", 31_001)


async def test_every_checkpoint_of_a_run_is_fenced_by_its_lease(store: SqlitePlanTaskStore) -> None:
    await store.create("t1", PLAN, 1000)
    await store.take_lease("t1", "host:1:old", 1000, 1.0)
    await store.take_lease("t1", "host:2:new", 5000, 30.0)  # the old lease had expired
    late = StepResult("r", StepStatus.FAILED, 0, BOB, 1, 1.0, reason="PEER_UNAVAILABLE")
    pin = WritePin("r", 0, BOB, "t1:r:0", "1.0.0", 5001)
    attempts = [
        store.record_step("t1", late, owner="host:1:old"),
        store.set_state("t1", PlanTaskState.FAILED, Usage(), 5001, "X", "", owner="host:1:old"),
        store.record_usage("t1", Usage(9, 9, 9.0), 5001, owner="host:1:old"),
        store.pin_write("t1", pin, Usage(9, 9, 9.0), owner="host:1:old"),
    ]
    for attempt in attempts:
        with pytest.raises(TaskLeased):
            await attempt
    loaded = await store.load("t1")
    assert (loaded.state, loaded.steps, loaded.pins, loaded.usage) == (
        PlanTaskState.CREATED,
        {},
        {},
        Usage(),
    )
    assert await store.record_step("t1", late, owner="host:2:new")


async def test_the_latest_pin_of_a_step_and_the_usage_with_it_are_kept(
    store: SqlitePlanTaskStore,
) -> None:
    await store.create("t1", PLAN, 1000)
    await store.take_lease("t1", "me", 1000, 30.0)
    first = WritePin("r", 0, BOB, "t1:r:0", "1.0.0", 2000)
    moved = WritePin("r", 0, spiffe("carol"), "t1:r:0", "1.0.0", 3000)  # bob refused: moved
    revised = WritePin("r", 1, spiffe("carol"), "t1:r:1", "1.0.0", 4000)
    await store.pin_write("t1", first, Usage(1, 1, 0.5), owner="me")
    await store.pin_write("t1", moved, Usage(1, 2, 0.7), owner="me")
    assert (await store.load("t1")).pins == {"r": moved}
    await store.pin_write("t1", revised, Usage(1, 3, 0.9), owner="me")
    loaded = await store.load("t1")
    assert loaded.pins == {"r": revised}
    assert (loaded.usage, loaded.updated_unix_ms) == (Usage(1, 3, 0.9), 4000)


# --- The runner: one process per task, budgets that survive a crash ---------------------------


class HeldRouter(Router):
    """Counts sends and holds each one until ``release`` is set."""

    sends = 0
    sent = asyncio.Event()
    release = asyncio.Event()

    async def send(self, offer: Any, payload: dict[str, Any], **kw: Any) -> InvokeResult:
        type(self).sends += 1
        self.sent.set()
        await self.release.wait()
        raise AssertionError("the test never releases a held send")


def held_router_class() -> type[HeldRouter]:
    return type(
        "Held", (HeldRouter,), {"sends": 0, "sent": asyncio.Event(), "release": asyncio.Event()}
    )


def parts(tmp_path: Path, routes: type[Router], **limits: Any) -> ExecutorParts:
    return ExecutorParts(
        agent_id=spiffe("alice"),
        router=router(tmp_path, FakePeer(), routes),
        store=SqlitePlanTaskStore(tmp_path / "tasks.sqlite"),
        planner=RerouteOrStop(),
        limits=PlanLimits(**limits),
    )


async def test_second_resume_of_a_running_task_is_refused_and_sends_nothing(
    tmp_path: Path,
) -> None:
    held = held_router_class()
    first, second = parts(tmp_path, held), parts(tmp_path, held)  # two processes' stores
    try:
        handle = PlanDriver(first).start(PLAN)
        await asyncio.wait_for(held.sent.wait(), WAIT)
        running = await first.store.load(handle.task_id)
        assert (running.usage.steps, running.usage.peer_calls) == (1, 1)  # with the call
        other = PlanDriver(second)
        with pytest.raises(TaskLeased) as refused:
            await asyncio.wait_for(other.resume(handle.task_id), WAIT)
        assert PlanDriver(first).owner != other.owner
        assert handle.task_id in refused.value.message and held.sends == 1
        handle.cancel()
        cancelled = await asyncio.wait_for(handle.result(), WAIT)
        assert cancelled.state is PlanTaskState.CANCELLED
        assert (await second.store.load(handle.task_id)).lease is None  # given back
        again = await asyncio.wait_for(other.resume(handle.task_id), WAIT)
        assert again.state is PlanTaskState.CANCELLED and held.sends == 1
    finally:
        first.store.close()
        second.store.close()


async def test_run_that_loses_its_lease_stops_and_records_nothing(tmp_path: Path) -> None:
    held = held_router_class()
    own = parts(tmp_path, held, lease_seconds=0.3)
    try:
        handle = PlanDriver(own).start(PLAN)
        await asyncio.wait_for(held.sent.wait(), WAIT)
        lease = (await own.store.load(handle.task_id)).lease
        assert lease is not None
        await own.store.take_lease(handle.task_id, "elsewhere:1:x", lease.expires_unix_ms + 1, 60)
        with pytest.raises(TaskLeased):
            await asyncio.wait_for(handle.result(), WAIT)  # at its next renewal
        after = await own.store.load(handle.task_id)
        assert after.steps == {} and after.state is PlanTaskState.WAITING_PEER
        assert after.lease is not None and after.lease.owner == "elsewhere:1:x"
        assert held.sends == 1
    finally:
        own.store.close()


async def test_resumed_task_counts_what_was_spent_before_and_while_down(tmp_path: Path) -> None:
    """Killed 3 s into a 5 s budget and resumed 2.5 s later: no budget is left, so the
    resumed task sends nothing and fails BUDGET_EXHAUSTED (a fresh budget would send)."""
    held = held_router_class()
    own = parts(tmp_path, held)
    now_ms = int(time.time() * 1000)
    try:
        await own.store.create("t1", PLAN, now_ms - 3000)
        await own.store.set_state(
            "t1", PlanTaskState.PLANNING, Usage(0, 0, 0.0), now_ms - 3000, "OK", ""
        )
        await own.store.set_state(
            "t1", PlanTaskState.RUNNING, Usage(1, 1, 3.0), now_ms - 2500, "OK", ""
        )
        result = await asyncio.wait_for(PlanDriver(own).resume("t1"), WAIT)
    finally:
        own.store.close()
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "BUDGET_EXHAUSTED")
    assert result.message.startswith("max_elapsed_seconds (5) reached")
    assert held.sends == 0 and result.elapsed_seconds >= 5.5 and result.peer_calls == 1


async def test_resumed_task_counts_the_peer_calls_made_before_the_crash(tmp_path: Path) -> None:
    held = held_router_class()
    own = parts(tmp_path, held)
    now_ms = int(time.time() * 1000)
    try:
        await own.store.create("t1", PLAN, now_ms)
        await own.store.set_state("t1", PlanTaskState.PLANNING, Usage(), now_ms, "OK", "")
        await own.store.set_state("t1", PlanTaskState.RUNNING, Usage(1, 3, 0.1), now_ms, "OK", "")
        result = await asyncio.wait_for(PlanDriver(own).resume("t1"), WAIT)
    finally:
        own.store.close()
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "BUDGET_EXHAUSTED")
    assert "max_peer_calls (3) reached" in result.message
    assert held.sends == 0 and result.peer_calls == 3


# --- Write pins honoured on resume --------------------------------------------------------------


def write_plan(capability: str) -> Plan:
    return Plan.model_validate(
        {
            "goal": "g",
            "max_risk": "write",
            "steps": [{"id": "w", "capability": capability, "input": {"text": "x", "q": 1}}],
        }
    )


async def pinned_resume(
    tmp_path: Path, capability: str, pin: WritePin
) -> tuple[Any, WriteCounter, type[HeldRouter]]:
    """A task whose step ``w`` a run pinned (``pin``) before it died; resumed here."""
    counter = WriteCounter()
    registry = CapabilityRegistry()
    registry.register(counter.capability())  # alice runs notes.write locally
    held = held_router_class()
    policy = write_policy(tmp_path / "policy.toml", [], [outbound_rule("bob", ["text.search"])])
    own = parts(tmp_path, held)
    own.router = held(
        registry=registry,
        policies=PolicyStore(policy),
        peers=[BOB],
        client_for=lambda _peer_id: FakePeer(risk="write"),  # type: ignore[arg-type, return-value]
    )
    dead = f"{socket.gethostname()}:{dead_pid()}:crashed"
    try:
        await own.store.create("t1", write_plan(capability), int(time.time() * 1000))
        await own.store.take_lease("t1", dead, int(time.time() * 1000), 60)
        now = replace(pin, time_unix_ms=int(time.time() * 1000))  # the usage is as of the pin
        await own.store.pin_write("t1", now, Usage(1, 1, 0.1), owner=dead)
        result = await asyncio.wait_for(PlanDriver(own).resume("t1"), WAIT)
    finally:
        own.store.close()
    return result, counter, held


async def test_write_pinned_locally_is_in_doubt_on_resume_and_not_run_again(
    tmp_path: Path,
) -> None:
    pin = WritePin("w", 0, "local", "t1:w:0", "1.0.0", 1)
    result, counter, held = await pinned_resume(tmp_path, "notes.write", pin)
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "IDEMPOTENCY_IN_DOUBT")
    assert result.steps["w"].where == "local" and result.steps["w"].may_have_written
    assert counter.calls == 0 and held.sends == 0


async def test_write_pinned_to_a_version_the_peer_no_longer_serves_is_not_moved(
    tmp_path: Path,
) -> None:
    pin = WritePin("w", 0, BOB, "t1:w:0", "0.9.0", 1)
    result, counter, held = await pinned_resume(tmp_path, "text.search", pin)
    assert (result.state, result.reason) == (PlanTaskState.FAILED, "VERSION_NOT_AVAILABLE")
    assert result.message.startswith(
        f"step 'w' failed on {BOB}: {BOB} no longer offers text.search 0.9.0 to this agent; "
    )
    assert WRITE_IN_DOUBT in result.message
    assert counter.calls == 0 and held.sends == 0
