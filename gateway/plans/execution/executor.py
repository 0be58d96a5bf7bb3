"""Running a task: ready steps concurrently, budgets enforced, progress stored, replanning.

One ``TaskExecutor`` runs one task once (a fresh start or a resume), holding
the task's lease (taken by the ``PlanDriver``) and renewing it while it runs.
Every state change, step result, revision, peer call and write pin is
checkpointed (fenced by the lease) before the executor moves on, so a restart
resumes without re-running completed steps or sending a write elsewhere, and
with the budget that was really spent.

A step that needs approval (``gateway.plans.execution.approval``) has its request
checkpointed and waits; once nothing else can run, the run ends in
``waiting-approval`` (time spent waiting for a person is not counted against
the budget). A step that depends on a result whose sources disagree does not
run unless it says ``on_unverified: continue``. A revision that would run a
step again on the same place with the same input as a failed attempt stops the
task (``STAGNATED``); each failed attempt is checkpointed with the step result
that reports it, so a resumed run remembers the attempts of earlier runs. A
step whose failure a run recorded but was cut off before answering (revising
the plan, or failing the task) is not run again on resume: the resumed run
answers that recorded failure as the cut-off run would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from capabilities.context import PeerCall
from capabilities.contract import Risk
from gateway.audit import AuditLog
from gateway.errors import (
    BudgetExhausted,
    Cancelled,
    GatewayError,
    InvalidInput,
    PeerUnavailable,
    PlanInvalid,
    Stagnated,
    TaskLeased,
    Unverified,
)
from gateway.identity.exchange import ActingFor
from gateway.outbound.router import Router
from gateway.plans.document.checks import PlanLimits, check_routes, check_structure
from gateway.plans.document.model import Plan, Step, resolve_input
from gateway.plans.execution.approval import ApprovalRequest, AwaitingApproval, threshold
from gateway.plans.execution.attempt_rules import StepProgress, abandoned_result
from gateway.plans.execution.budget import BudgetMeter
from gateway.plans.execution.crash_points import AFTER_FAILURE_RECORDED, crash_point
from gateway.plans.execution.planner import Failure, Planner
from gateway.plans.execution.step_events import EventSink, StepEvent
from gateway.plans.execution.step_executor import StepExecutor
from gateway.plans.execution.verification import Confidence, comparison_digest
from gateway.plans.store.progress import StoredProgress
from gateway.plans.store.records import FailedAttempt, StoredPlanTask
from gateway.plans.store.resume_point import resume_point
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import (
    PlanTaskResult,
    PlanTaskState,
    RevisionRecord,
    StepResult,
    StepStatus,
    transition,
)
from gateway.runtime.stopping import cancel_and_wait
from gateway.telemetry import Telemetry


@dataclass
class _Ending:
    state: PlanTaskState
    reason: str = "OK"
    message: str = ""


@dataclass
class ExecutorParts:
    """What every executor of one agent shares."""

    agent_id: str
    router: Router
    store: PlanTaskStore
    planner: Planner
    limits: PlanLimits
    bind_peer_call: Callable[[float, str, str, ActingFor | None], PeerCall] | None = None
    approval_min_risk: Risk | None = None
    """The agent's ``[plans] approval_min_risk``: applies to every plan it runs."""
    telemetry: Telemetry | None = None
    audit: AuditLog | None = None
    """Where steps run locally are recorded (``gateway.plans.execution.local_step_audit``)."""


class TaskExecutor:
    """Runs (or resumes) one checkpointed task to a terminal state."""

    def __init__(
        self,
        parts: ExecutorParts,
        stored: StoredPlanTask,
        on_event: EventSink,
        owner: str,
        acting_for: ActingFor | None = None,
    ) -> None:
        self._parts = parts
        self._acting_for = acting_for
        self._pins = stored.pins
        self._task_id = stored.task_id
        self._plan = stored.plan
        self._state = stored.state
        self._revision = stored.revision
        self._revisions = list(stored.revisions)
        start = resume_point(stored)
        self._unanswered = start.unanswered
        self._results = dict(start.results)
        self._approvals = dict(stored.approvals)
        self._waiting: dict[str, ApprovalRequest] = {}
        self._failed_attempts = set(stored.failed_attempts)
        self._inputs: dict[asyncio.Task[StepResult], dict[str, object]] = {}
        self._meter = BudgetMeter(stored.plan.budget, start.usage, down_seconds=start.down_seconds)
        self._stored_progress = StoredProgress(
            parts.store, stored.task_id, owner, self._meter, parts.limits.lease_seconds
        )
        self._lease_lost = False
        self._running_task: asyncio.Task[object] | None = None
        self._on_event = on_event
        self._in_flight: dict[asyncio.Task[StepResult], Step] = {}
        self._progress: dict[asyncio.Task[StepResult], StepProgress] = {}

    async def run(self, cancel: asyncio.Event) -> PlanTaskResult:
        """Plan, run and finish; an asyncio cancellation (shutdown) leaves the task resumable.

        Raises:
            TaskLeased: this run lost the task's lease; it stopped without recording more.
        """
        self._running_task = asyncio.current_task()
        keeper = asyncio.create_task(self._stored_progress.keep_lease(self._lose_lease))
        tracing = (self._parts.telemetry or Telemetry.off(self._parts.agent_id)).tracing
        attributes: dict[str, str | int] = {
            "a2agw.task_id": self._task_id,
            "a2agw.steps": len(self._plan.steps),
        }
        try:
            # One trace per run: route discovery, every step and every hop below it.
            with tracing.span("plan", attributes) as span:
                ending = await self._plan_and_run(cancel)
                span.set_attribute("a2agw.task_state", ending.state.value)
                span.set_attribute("a2agw.reason", ending.reason)
            await self._set_state(ending.state, ending.reason, ending.message)
        except asyncio.CancelledError:
            await self._abandon_in_flight()
            if self._lease_lost:  # the keeper cancelled this run
                _uncancel()
                raise TaskLeased(f"task {self._task_id}: this process lost its lease") from None
            with contextlib.suppress(TaskLeased):
                await asyncio.shield(self._stored_progress.usage())
            raise
        except TaskLeased:
            await self._abandon_in_flight()
            raise
        finally:
            await cancel_and_wait(keeper)
        return self.result(ending)

    def _lose_lease(self) -> None:
        self._lease_lost = True
        running = self._running_task
        if running is not None:
            running.cancel()

    async def _plan_and_run(self, cancel: asyncio.Event) -> _Ending:
        await self._set_state(PlanTaskState.PLANNING)
        try:
            self._meter.check_time()  # a resumed task may have spent it all already
        except BudgetExhausted as err:
            return self._failed(err.reason, err.message)
        try:
            check_structure(self._plan, self._parts.limits)
            names = [s.capability for s in self._plan.steps if s.id not in self._results]
            catalog, skipped = await self._parts.router.catalog(
                names, deadline=self._meter.deadline
            )
            check_routes(self._plan, catalog, skip=frozenset(self._results), skipped=skipped)
        except (PlanInvalid, PeerUnavailable) as err:
            return _Ending(PlanTaskState.FAILED, err.reason, err.message)
        # After the route check, as in the run that recorded them: a step revised here
        # is not checked again (it fails when it runs, as it would have there).
        ending = await self._answer_recorded_failures()
        if ending is not None:
            return ending
        await self._set_state(PlanTaskState.RUNNING)
        return await self._loop(cancel)

    async def _loop(self, cancel: asyncio.Event) -> _Ending:
        steps = self._step_executor()
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            while True:
                steps_before = self._meter.steps
                ending = self._start_ready(steps)
                if self._meter.steps != steps_before:
                    await self._stored_progress.usage()
                if ending is None and not self._in_flight:
                    ending = self._finished()
                if ending is not None:
                    await self._abandon_in_flight(ending)
                    return ending
                await self._set_live_state()
                done, _ = await asyncio.wait(
                    [*self._in_flight, cancelled],
                    timeout=self._meter.remaining(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if cancel.is_set():
                    ending = _Ending(PlanTaskState.CANCELLED, "CANCELLED", "cancelled by request")
                    await self._abandon_in_flight(ending)
                    return ending
                if not done:
                    err = BudgetExhausted(
                        f"max_elapsed_seconds ({self._plan.budget.max_elapsed_seconds:g}) reached"
                    )
                    await self._abandon_in_flight(
                        _Ending(PlanTaskState.FAILED, err.reason, err.message)
                    )
                    return self._failed(err.reason, err.message)
                for task in [t for t in self._in_flight if t in done]:
                    ending = await self._collect(task)
                    if ending is not None:
                        await self._abandon_in_flight(ending)
                        return ending
                steps = self._step_executor()
        finally:
            cancelled.cancel()

    def _step_executor(self) -> StepExecutor:
        return StepExecutor(
            agent_id=self._parts.agent_id,
            task_id=self._task_id,
            plan=self._plan,
            router=self._parts.router,
            meter=self._meter,
            stored_progress=self._stored_progress,
            default_retries=self._parts.limits.default_retries,
            pins=self._pins,
            bind_peer_call=self._parts.bind_peer_call,
            acting_for=self._acting_for,
            approvals=self._approvals,
            approval_min=self._approval_min(),
            telemetry=self._parts.telemetry,
            audit=self._parts.audit,
        )

    def _approval_min(self) -> Risk | None:
        approval = self._plan.approval
        return threshold(approval.min_risk if approval else None, self._parts.approval_min_risk)

    def _ready(self) -> list[Step]:
        running = {step.id for step in self._in_flight.values()}
        done = self._done()
        return [
            step
            for step in self._plan.steps
            if step.id not in done
            and step.id not in running
            and step.id not in self._results  # a failed step waits for a revision
            and step.id not in self._waiting
            and all(dep in done for dep in step.depends_on)
        ]

    def _done(self) -> set[str]:
        return {s for s, r in self._results.items() if r.status is StepStatus.COMPLETED}

    def _start_ready(self, steps: StepExecutor) -> _Ending | None:
        outputs = {sid: r.output for sid, r in self._results.items()}
        for step in self._ready():
            if len(self._in_flight) >= self._plan.max_parallel:
                break
            disputed = self._disputed_inputs(step)
            if disputed and step.on_unverified == "stop":
                err = Unverified(
                    f"step {step.id!r} was not run: the sources of {', '.join(disputed)} "
                    "disagree (on_unverified: stop)"
                )
                return self._failed(err.reason, err.message)
            try:
                self._meter.take_step()
                resolved = resolve_input(step.input, outputs)
            except BudgetExhausted as err:
                return self._failed(err.reason, err.message)
            except KeyError as err:
                problem = InvalidInput(f"step {step.id!r}: {err.args[0]!r} is not in that output")
                return self._failed(problem.reason, problem.message)
            progress = StepProgress()
            task = asyncio.create_task(steps.run(step, resolved, progress))
            self._in_flight[task], self._progress[task] = step, progress
            self._inputs[task] = resolved
            self._on_event(StepEvent(step.id, "started"))
        return None

    def _disputed_inputs(self, step: Step) -> list[str]:
        """Dependencies of ``step`` that asked for verification and whose sources disagree."""
        return [
            dep
            for dep in step.depends_on
            if self._results[dep].asked_verification
            and self._results[dep].confidence is Confidence.UNVERIFIED
        ]

    def _finished(self) -> _Ending:
        missing = [s.id for s in self._plan.steps if s.id not in self._done()]
        if not missing:
            return _Ending(PlanTaskState.COMPLETED)
        if self._waiting:
            waiting = ", ".join(sorted(self._waiting))
            return _Ending(
                PlanTaskState.WAITING_APPROVAL, "OK", f"steps {waiting} wait for approval"
            )
        return self._failed("INTERNAL", f"steps {', '.join(missing)} can never become ready")

    async def _collect(self, task: asyncio.Task[StepResult]) -> _Ending | None:
        step = self._in_flight.pop(task)
        self._progress.pop(task, None)
        resolved = self._inputs.pop(task, {})
        try:
            result = task.result()
        except AwaitingApproval as waiting:
            await self._stored_progress.request_approval(waiting.request)
            self._approvals[step.id] = self._waiting[step.id] = waiting.request
            self._on_event(StepEvent(step.id, "waiting-approval", waiting.request.where))
            return None
        attempt = _failed_attempt(result, resolved)
        if not await self._record(step, result, attempt):
            return None
        if result.status is StepStatus.COMPLETED:
            return None
        crash_point(AFTER_FAILURE_RECORDED)
        if attempt is not None:
            self._failed_attempts.add(attempt)
        return await self._answer_failure(step, result)

    async def _answer_recorded_failures(self) -> _Ending | None:
        """Answer the failures an earlier run recorded but was cut off before answering.

        Such a step is not run again (the run that recorded the failure would not
        have: it revises the plan or ends the task); this run does what that one
        would have done next, with the failed attempt it checkpointed too.
        """
        for step_id, result in list(self._unanswered.items()):
            del self._unanswered[step_id]
            ending = await self._answer_failure(self._plan.step(step_id), result)
            if ending is not None:
                return ending
        return None

    async def _answer_failure(self, step: Step, result: StepResult) -> _Ending | None:
        """Revise the plan after ``step`` failed with the recorded ``result``, or end the task."""
        if result.reason == BudgetExhausted.reason:  # the budget stopped it, not the place
            return self._failed(result.reason, result.message)
        try:
            if await self._replan(step, result):
                return None
        except Stagnated as err:
            return self._failed(err.reason, err.message)
        where = f" on {result.where}" if result.where else ""
        return self._failed(result.reason, f"step {step.id!r} failed{where}: {result.message}")

    async def _replan(self, step: Step, result: StepResult) -> bool:
        if len(self._revisions) >= self._plan.budget.max_revisions:
            return False
        revision = self._revision + 1
        done = frozenset(self._done())
        failure = Failure(step, result.reason, result.where, result.may_have_written)
        proposal = await self._parts.planner.revise(self._plan, failure, done, revision)
        if proposal is None or not self._acceptable(proposal.plan, done):
            return False
        await self._check_progress(proposal.plan.step(step.id))
        await self._set_state(PlanTaskState.PLANNING)
        record = RevisionRecord(revision, proposal.reason, int(time.time() * 1000))
        await self._stored_progress.revise(proposal.plan, record)
        self._plan, self._revision = proposal.plan, revision
        self._revisions.append(record)
        del self._results[step.id]
        await self._set_state(PlanTaskState.RUNNING)
        return True

    async def _check_progress(self, step: Step) -> None:
        """Stagnated if ``step`` would go where an earlier attempt with this input failed."""
        outputs = {sid: r.output for sid, r in self._results.items()}
        try:
            digest = comparison_digest(resolve_input(step.input, outputs))
        except KeyError:
            return  # the step cannot run at all; the loop reports that
        offers, _ = await self._parts.router.offers(
            step.capability,
            step.constraint,
            avoid=step.avoid,
            deadline=self._meter.deadline,
            max_risk=self._plan.max_risk,
        )
        if offers and FailedAttempt(step.id, offers[0].where, digest) in self._failed_attempts:
            raise Stagnated(
                f"step {step.id!r}: the revised plan would run it on {offers[0].where} with "
                "the same input as an attempt that already failed"
            )

    def _acceptable(self, plan: Plan, done: frozenset[str]) -> bool:
        try:
            check_structure(plan, self._parts.limits)
            return all(plan.step(sid) == self._plan.step(sid) for sid in done)
        except (PlanInvalid, KeyError):
            return False

    def _failed(self, reason: str, message: str) -> _Ending:
        completed = sorted(self._done())
        summary = ", ".join(completed) if completed else "none"
        return _Ending(PlanTaskState.FAILED, reason, f"{message}; completed steps: {summary}")

    async def _record(
        self, step: Step, result: StepResult, failed: FailedAttempt | None = None
    ) -> bool:
        """Checkpoint ``result`` (and the attempt it ``failed``) unless it is of an older
        revision of the step."""
        if result.revision != self._plan.step(step.id).revision:
            self._on_event(StepEvent(step.id, "skipped", result.where, result.duration_ms))
            return False
        await self._stored_progress.step_result(result, failed)
        self._results[step.id] = result
        self._on_event(
            StepEvent(step.id, result.status.value, result.where, result.duration_ms, result.reason)
        )
        return True

    async def _abandon_in_flight(self, ending: _Ending | None = None) -> None:
        """Cancel the steps in flight; when the task ends (``ending``), record each of them.

        Without ``ending`` (shutdown) nothing is recorded: the task stays resumable.
        """
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, GatewayError, AwaitingApproval):
                await task
        if ending is not None:
            for task in tasks:
                await self._record(self._in_flight[task], self._abandoned(task, ending))
        self._in_flight.clear()
        self._progress.clear()
        self._inputs.clear()

    def _abandoned(self, task: asyncio.Task[StepResult], ending: _Ending) -> StepResult:
        if not task.cancelled() and task.exception() is None:  # it finished as it was cancelled
            return task.result()
        reason, message = ending.reason, ending.message
        if reason != BudgetExhausted.reason:
            reason = Cancelled.reason
            message = f"abandoned: the task ended ({ending.reason})"
        return abandoned_result(self._in_flight[task], self._progress[task], reason, message)

    async def _set_live_state(self) -> None:
        router = self._parts.router
        remote_only = bool(self._in_flight) and not any(
            router.has_local(step.capability, step.constraint) and "local" not in step.avoid
            for step in self._in_flight.values()
        )
        await self._set_state(PlanTaskState.WAITING_PEER if remote_only else PlanTaskState.RUNNING)

    async def _set_state(self, state: PlanTaskState, reason: str = "OK", message: str = "") -> None:
        if state is self._state and not state.terminal:
            return
        self._state = transition(self._state, state)
        await self._stored_progress.state(state, reason, message)

    def result(self, ending: _Ending) -> PlanTaskResult:
        """The typed result for ``ending``."""
        usage = self._meter.usage()
        return PlanTaskResult(
            task_id=self._task_id,
            state=ending.state,
            revision=self._revision,
            steps=dict(self._results),
            reason=ending.reason,
            message=ending.message,
            revisions=tuple(self._revisions),
            peer_calls=usage.peer_calls,
            elapsed_seconds=usage.elapsed_seconds,
            tool_calls=usage.tool_calls,
            approvals=tuple(self._waiting.values()),
        )


def _uncancel() -> None:
    # The cancellation came from our own lease keeper and is answered by
    # TaskLeased; it must not linger on the task for later awaits.
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _failed_attempt(result: StepResult, resolved: dict[str, object]) -> FailedAttempt | None:
    """The attempt ``result`` reports as failed, remembered against stagnation; None if
    it completed or the budget ended it (the place and input did not fail)."""
    if result.status is StepStatus.COMPLETED or result.reason == BudgetExhausted.reason:
        return None
    return FailedAttempt(result.step_id, result.where, comparison_digest(resolved))
