"""Running one step: pick a route, send the minimal payload, retry, fail over, verify.

* Minimal payload: exactly the fields the route's input schema declares, taken
  from the resolved step input, and inside them only what their schemas declare
  (``gateway.plans.execution.minimise``); nothing else leaves the agent.
* Retries: only transient failures (unavailable, timeout), only for ``read``
  or idempotent capabilities, with one idempotency key ``task:step:revision``.
* Deadlines: one attempt at a peer gets the contract timeout the peer advertised
  plus a margin (``ATTEMPT_MARGIN_SECONDS``), never more than the task has left,
  so a silent peer costs one timeout per attempt, not the whole task budget.
* Failover: a read whose peer stays unreachable or silent moves to the next route.
* A write (risk above ``read``) never moves once it may have reached a peer
  (anything but a refusal that proves nothing ran): the idempotency key only
  protects on that peer, so it may retry there, else the step fails saying the
  write's outcome is unknown (``StepProgress.written_at``).
* Write pins: before a write attempt is sent, where it goes and its key are
  checkpointed (``StoredProgress.pin_write``). A resumed task sends a pinned
  step only to that place again with the same key (the peer answers with the
  stored result or ``IDEMPOTENCY_IN_DOUBT``), or fails naming the place and
  saying the write's outcome is unknown; a pinned local write (no idempotency
  store behind it) fails ``IDEMPOTENCY_IN_DOUBT``.
* Remote outputs are untrusted: digest, served version and output schema are checked.
* Verification (``verify: {"quorum": N}``): the step runs on the first N routes
  at once, each attempt counted against the budget; their outputs are compared
  (``gateway.plans.execution.verification``) and the result carries its confidence, every
  source's evidence and, when they disagree, every distinct output.
* Approval: a route at or above the approval risk sends nothing (nor runs
  locally) without a decision binding to this step, place, version and payload
  digest; without one the runner raises ``AwaitingApproval`` (``gateway.plans.execution.approval``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import Status, StatusCode

from capabilities.context import CallContext, PeerCall
from capabilities.contract import Risk
from capabilities.runner import run_capability
from capabilities.versions import VersionConstraint
from gateway.audit import AuditLog
from gateway.errors import (
    ApprovalDenied,
    BudgetExhausted,
    CapabilityNotGranted,
    DeadlineExceeded,
    GatewayError,
    IdempotencyInDoubt,
    InvalidInput,
    NoRoute,
    PeerUnavailable,
    PlanInvalid,
    TaskLeased,
    VersionNotAvailable,
)
from gateway.identity.exchange import ActingFor
from gateway.outbound.router import LOCAL, Offer, Router, encode_payload
from gateway.plans.document.model import Plan, Step
from gateway.plans.execution.approval import (
    ApprovalRequest,
    AwaitingApproval,
    Decision,
    needs_approval,
    request_for,
)
from gateway.plans.execution.attempt_rules import (
    WRITE_IN_DOUBT,
    StepProgress,
    attempt_timeout,
    failed_result,
    may_fail_over,
    written_note,
)
from gateway.plans.execution.budget import BudgetMeter
from gateway.plans.execution.crash_points import (
    AFTER_ANSWER,
    AFTER_CHECKPOINT_BEFORE_SEND,
    BEFORE_CHECKPOINT,
    crash_point,
)
from gateway.plans.execution.local_step_audit import LocalStepAudit
from gateway.plans.execution.minimise import declared_part
from gateway.plans.execution.step_answer import (
    StepAnswer,
    check_expect,
    deterministic,
    now_ms,
    peer_answer,
)
from gateway.plans.execution.verification import (
    Confidence,
    comparison_digest,
    judge,
)
from gateway.plans.store.progress import StoredProgress
from gateway.plans.store.records import WritePin
from gateway.plans.task import Evidence, StepResult, StepStatus
from gateway.telemetry import Telemetry

_STALE_DISCOVERY = (VersionNotAvailable, CapabilityNotGranted)
_BACKOFF_SECONDS = 0.05
_MAX_BACKOFF_SECONDS = 0.5


def minimal_payload(resolved: dict[str, Any], offer: Offer) -> dict[str, Any]:
    """The fields of ``resolved`` the route's contract declares, and nothing else, nested
    fields included.

    Raises:
        InvalidInput: the contract's input schema cannot be followed (nothing is sent).
    """
    schema = offer.input_schema
    properties = schema.get("properties")
    declared = properties if isinstance(properties, dict) else {}
    return {
        name: declared_part(resolved[name], declared.get(name, True), schema)
        for name in sorted(offer.input_fields)
        if name in resolved
    }


class StepExecutor:
    """Runs steps of one task on the routes the router offers."""

    def __init__(
        self,
        *,
        agent_id: str,
        task_id: str,
        plan: Plan,
        router: Router,
        meter: BudgetMeter,
        stored_progress: StoredProgress,
        default_retries: int,
        pins: Mapping[str, WritePin] | None = None,
        bind_peer_call: Callable[[float, str, str, ActingFor | None], PeerCall] | None = None,
        acting_for: ActingFor | None = None,
        approvals: Mapping[str, ApprovalRequest] | None = None,
        approval_min: Risk | None = None,
        telemetry: Telemetry | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self._audit = audit
        self._approvals = approvals or {}
        self._approval_min = approval_min
        self._telemetry = telemetry if telemetry is not None else Telemetry.off(agent_id)
        self._stored_progress = stored_progress
        self._pins = pins or {}
        self._agent_id = agent_id
        self._task_id = task_id
        self._plan = plan
        self._router = router
        self._meter = meter
        self._default_retries = default_retries
        self._bind = bind_peer_call
        self._acting_for = acting_for

    async def run(
        self, step: Step, resolved: dict[str, Any], progress: StepProgress | None = None
    ) -> StepResult:
        """Run ``step`` to a completed or failed result.

        ``progress`` (the executor's, to see where an abandoned step was sent) is
        updated as the step runs. The only GatewayError raised is TaskLeased
        (this run lost its lease: nothing more may be sent or recorded).

        Raises:
            AwaitingApproval: the step needs a person's approval before it sends.
        """
        attributes: dict[str, str | int] = {
            "a2agw.task_id": self._task_id,
            "a2agw.step_id": step.id,
            "a2agw.capability": step.capability,
            "a2agw.step_revision": step.revision,
        }
        with self._telemetry.tracing.span("plan step", attributes) as span:
            result = await self._run(step, resolved, progress)
            span.set_attribute("a2agw.step_status", result.status.value)
            span.set_attribute("a2agw.attempts", result.attempts)
            if result.status is not StepStatus.COMPLETED:
                span.set_attribute("a2agw.reason", result.reason)
                span.set_status(Status(StatusCode.ERROR, result.reason))
        self._telemetry.metrics.plan_step(result.status.value, result.reason or "OK")
        return result

    async def _run(
        self, step: Step, resolved: dict[str, Any], progress: StepProgress | None
    ) -> StepResult:
        tally = progress if progress is not None else StepProgress()
        try:
            pin = self._pins.get(step.id)
            if pin is not None and pin.revision == step.revision:
                answer, where = await self._run_pinned(step, resolved, pin, tally)
            elif step.verify is not None:
                answer, where = await self._run_verified(step, resolved, tally)
            else:
                answer, where = await self._run_routes(step, resolved, tally)
        except TaskLeased:
            raise
        except GatewayError as err:
            message = err.message
            if tally.written_at:
                tally.notes.append(written_note(tally.written_at))
                if not isinstance(err, BudgetExhausted | IdempotencyInDoubt):  # they say so
                    message = f"{message}; {WRITE_IN_DOUBT}"
            return failed_result(step, tally, err.reason, message, tally.notes)
        return StepResult(
            step_id=step.id,
            status=StepStatus.COMPLETED,
            revision=step.revision,
            where=where,
            attempts=tally.attempts,
            duration_ms=tally.elapsed_ms(),
            output=answer.output,
            evidence=answer.evidence,
            remembered=answer.remembered,
            notes=tuple(tally.notes),
            confidence=answer.confidence,
            sources=answer.sources or (answer.evidence,),
            candidates=answer.candidates,
            asked_verification=step.asks_verification,
        )

    async def _run_routes(
        self, step: Step, resolved: dict[str, Any], tally: StepProgress
    ) -> tuple[StepAnswer, str]:
        allowed = await self._routes(step, tally)
        last: GatewayError | None = None
        for offer in allowed:
            try:
                return await self._run_offer(step, resolved, offer, tally), offer.where
            except BudgetExhausted:
                raise
            except GatewayError as err:
                last = err
                if not may_fail_over(err, offer, tally):
                    raise
                tally.notes.append(f"{offer.where}: {err.reason}, trying the next route")
        assert last is not None
        raise last

    async def _run_verified(
        self, step: Step, resolved: dict[str, Any], tally: StepProgress
    ) -> tuple[StepAnswer, str]:
        """Run ``step`` on ``verify.quorum`` routes at once and judge their outputs."""
        assert step.verify is not None
        sources = [o for o in await self._routes(step, tally) if o.retryable]
        sources = sources[: step.verify.quorum]
        if len(sources) < step.verify.quorum:
            tally.notes.append(
                f"only {len(sources)} of {step.verify.quorum} sources can run this step"
            )
        if not sources:
            raise NoRoute(f"no read or idempotent route can run {step.capability} for a quorum")
        if any(needs_approval(offer.risk, self._approval_min) for offer in sources):
            # One approval binds to one place; a quorum would need one per source.
            raise PlanInvalid(
                f"step {step.id!r}: verify cannot run a step that needs approval on "
                "several sources; verify only reads, or approve a single source"
            )
        outcomes = await asyncio.gather(
            *(self._run_offer(step, resolved, offer, tally) for offer in sources),
            return_exceptions=True,
        )
        answers: list[StepAnswer] = []
        failures: list[GatewayError] = []
        for offer, outcome in zip(sources, outcomes, strict=True):
            if isinstance(outcome, TaskLeased | AwaitingApproval | BudgetExhausted):
                raise outcome
            if isinstance(outcome, GatewayError):
                failures.append(outcome)
                tally.notes.append(f"{offer.where}: {outcome.reason}, no answer for the quorum")
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answers.append(outcome)
        if not answers:
            raise failures[0]
        compare = step.verify.compare
        verdict = judge(step.verify, [comparison_digest(a.output, compare) for a in answers])
        confidence = verdict.confidence
        if confidence is Confidence.PARTIAL and deterministic(step):
            confidence = Confidence.VERIFIED  # a passing deterministic check
        chosen = answers[verdict.chosen]
        tally.where = chosen.evidence.where
        answer = StepAnswer(
            chosen.output,
            chosen.evidence,
            chosen.remembered,
            confidence,
            tuple(a.evidence for a in answers),
            tuple(answers[i].output for i in verdict.candidates),
        )
        return answer, chosen.evidence.where

    async def _routes(self, step: Step, tally: StepProgress) -> list[Offer]:
        allowed, skipped = await self._router.offers(
            step.capability,
            step.constraint,
            avoid=step.avoid,
            deadline=self._meter.deadline,
            max_risk=self._plan.max_risk,
        )
        if not allowed or allowed[0].where != LOCAL:  # peers passed over on the way to a peer
            tally.notes += [f"{s.where}: {s.reason}" for s in skipped]
        unreachable = [s.where for s in skipped if s.unreachable]
        if not allowed and unreachable:
            raise PeerUnavailable(
                f"no reachable route can run {step.capability}@{step.constraint}; "
                f"could not reach {', '.join(unreachable)} to ask"
            )
        if not allowed:
            raise NoRoute(
                f"no local capability or authorized peer can run {step.capability}"
                f"@{step.constraint} within risk {self._plan.max_risk.value}"
            )
        return allowed

    async def _run_pinned(
        self, step: Step, resolved: dict[str, Any], pin: WritePin, tally: StepProgress
    ) -> tuple[StepAnswer, str]:
        """Resume a write an earlier run pinned to ``pin.where``: there, or nowhere."""
        tally.written_at = tally.where = pin.where
        tally.notes.append(f"{pin.where}: an earlier run sent this write there; resumed there only")
        if pin.where == LOCAL:
            raise IdempotencyInDoubt(
                "an earlier run of this task was cut off while this write ran locally; "
                "running it again could write twice"
            )
        offers, skipped = await self._router.offers(
            step.capability,
            VersionConstraint.parse(pin.version),  # exactly the version the write went to
            deadline=self._meter.deadline,
            max_risk=self._plan.max_risk,
        )
        offer = next((o for o in offers if o.where == pin.where), None)
        if offer is None and any(s.where == pin.where and s.unreachable for s in skipped):
            raise PeerUnavailable(f"could not reach {pin.where}")
        if offer is None:
            raise VersionNotAvailable(
                f"{pin.where} no longer offers {step.capability} {pin.version} to this agent"
            )
        return await self._run_offer(step, resolved, offer, tally), offer.where

    async def _run_offer(
        self, step: Step, resolved: dict[str, Any], offer: Offer, tally: StepProgress
    ) -> StepAnswer:
        tries = 1 + (self._retries(step) if offer.retryable else 0)
        for attempt in range(tries):
            try:
                answer = await self._attempt(step, resolved, offer, tally)
            except GatewayError as err:
                if isinstance(err, _STALE_DISCOVERY) and offer.where != LOCAL:
                    self._router.forget(offer.where)
                if isinstance(err, DeadlineExceeded) and self._meter.remaining() <= 0:
                    self._meter.check_time()
                if not err.transient or attempt + 1 >= tries:
                    raise
                await asyncio.sleep(min(_BACKOFF_SECONDS * 2**attempt, _MAX_BACKOFF_SECONDS))
                self._meter.check_time()
                continue
            return answer
        raise AssertionError("unreachable: the last try raises or returns")

    async def _attempt(
        self, step: Step, resolved: dict[str, Any], offer: Offer, tally: StepProgress
    ) -> StepAnswer:
        self._check_approval(step, resolved, offer)
        tally.attempts += 1
        tally.where = offer.where
        earlier = tally.written_at
        if offer.risk is not Risk.READ:
            tally.written_at = offer.where  # until an answer proves nothing ran
        try:
            answer = await self._once(step, resolved, offer, tally.attempts)
        except GatewayError as err:
            if not earlier and offer.where != LOCAL and err.nothing_ran:
                tally.written_at = ""
            raise
        check_expect(step, answer.output)
        if step.verify is None and deterministic(step):
            return StepAnswer(
                answer.output, answer.evidence, answer.remembered, Confidence.VERIFIED
            )
        return answer

    def _check_approval(self, step: Step, resolved: dict[str, Any], offer: Offer) -> None:
        """Nothing is sent for a route that needs approval unless a decision binds to it.

        Raises:
            ApprovalDenied: a person denied exactly this.
            AwaitingApproval: no decision covers this step, place, version and payload.
        """
        if not needs_approval(offer.risk, self._approval_min):
            return
        wanted = request_for(
            step.id,
            step.capability,
            offer.where,
            str(offer.version),
            offer.risk,
            minimal_payload(resolved, offer),
        )
        decided = self._approvals.get(step.id)
        if decided is not None and decided.binds(wanted):
            if decided.decision is Decision.APPROVED:
                return
            if decided.decision is Decision.DENIED:
                raise ApprovalDenied(
                    f"step {step.id!r}: {decided.decided_by} denied sending it to {offer.where}"
                )
            raise AwaitingApproval(decided)
        raise AwaitingApproval(wanted)

    def _retries(self, step: Step) -> int:
        return self._default_retries if step.max_retries is None else step.max_retries

    async def _once(self, step: Step, resolved: dict[str, Any], offer: Offer, n: int) -> StepAnswer:
        payload = minimal_payload(resolved, offer)
        key = f"{self._task_id}:{step.id}:{step.revision}"
        if offer.local is not None:
            if offer.risk is not Risk.READ:
                await self._pin(step, offer, key)
            return await self._run_local(step, payload, offer, key, n)
        self._meter.take_peer_call()
        if offer.risk is not Risk.READ:
            crash_point(BEFORE_CHECKPOINT)
            await self._pin(step, offer, key)
            crash_point(AFTER_CHECKPOINT_BEFORE_SEND)
        else:
            await self._stored_progress.usage()
        result = await self._router.send(
            offer,
            payload,
            timeout=attempt_timeout(offer, self._meter.remaining()),
            request_id=_request_id(self._task_id, step, n),
            task_id=self._task_id,
            step_id=step.id,
            idempotency_key=key,
            acting_for=self._acting_for,
        )
        crash_point(AFTER_ANSWER)
        return peer_answer(step, offer, result)

    async def _pin(self, step: Step, offer: Offer, key: str) -> None:
        await self._stored_progress.pin_write(
            step.id, step.revision, offer.where, key, str(offer.version)
        )

    async def _run_local(
        self, step: Step, payload: dict[str, Any], offer: Offer, key: str, n: int
    ) -> StepAnswer:
        assert offer.local is not None
        self._meter.take_tool_call()
        contract = offer.local.contract
        encoded = encode_payload(payload)
        try:
            model = contract.input_model.model_validate_json(encoded)
        except ValueError as err:
            raise InvalidInput(f"step input does not match {contract.key}") from err
        deadline = self._meter.deadline
        request_id = _request_id(self._task_id, step, n)
        ctx = CallContext(
            peer_id=self._agent_id,
            request_id=request_id,
            deadline=deadline,
            task_id=self._task_id,
            step_id=step.id,
            idempotency_key=key,
            call_peer=None
            if self._bind is None
            else self._bind(deadline, self._task_id, step.id, self._acting_for),
        )
        capability = offer.local
        if self._audit is None:
            result = await run_capability(capability, model, ctx)
        else:
            record = LocalStepAudit(
                self._audit,
                agent_id=self._agent_id,
                request_id=request_id,
                task_id=self._task_id,
                step_id=step.id,
                capability=step.capability,
                constraint=step.version,
                served=str(contract.version),
                payload=encoded,
            )
            result = await record.around(
                contract.risk, lambda: run_capability(capability, model, ctx)
            )
        digest = result.evidence_sha256
        evidence = Evidence(step.id, LOCAL, str(contract.version), now_ms(), digest)
        return StepAnswer(json.loads(result.payload), evidence, False)


def _request_id(task_id: str, step: Step, attempt: int) -> str:
    # Unique per attempt, also across restarts (peers refuse a repeated request id).
    return f"{task_id}.{step.id}.{step.revision}.{attempt}.{uuid.uuid4().hex[:8]}"
