"""How a task's checkpoint is laid out in rows, on both backends: the columns of each
table, and rows to and from checkpoint records (a PostgreSQL row has the agent id
in front of the same columns)."""

from __future__ import annotations

import json
from typing import Any

from gateway.plans.document.model import parse_plan
from gateway.plans.execution.approval import ApprovalRequest, Decision
from gateway.plans.execution.verification import Confidence
from gateway.plans.store.records import FailedAttempt, StoredPlanTask, Usage, WritePin
from gateway.plans.task import Evidence, PlanTaskState, RevisionRecord, StepResult, StepStatus

TASK_COLUMNS = (
    "task_id, plan_json, state, revision, reason, message, steps_used, peer_calls, "
    "elapsed, created_ms, updated_ms, tool_calls, on_behalf_of, user_issuer"
)
"""The ``tasks`` columns :func:`stored_task` reads, in order."""
STEP_COLUMNS = (
    "task_id, step_id, revision, status, where_, attempts, duration_ms, output_json, "
    "served_version, time_ms, sha256, replayed, reason, message, notes_json, confidence, "
    "sources_json, candidates_json, asked_verification, may_have_written"
)
"""The step columns :func:`step_row` writes and :func:`step_result` reads, in order."""
PIN_COLUMNS = "step_id, revision, where_, idempotency_key, version, time_ms"
"""The write pin columns after the task id (:func:`pin_row`, :func:`write_pin`)."""
FAILED_COLUMNS = "step_id, where_, input_sha256"
"""The failed attempt columns after the task id (:func:`failed_row`, :func:`failed_attempt`)."""


def step_row(task_id: str, result: StepResult) -> tuple[Any, ...]:
    evidence = result.evidence
    return (
        task_id,
        result.step_id,
        result.revision,
        result.status.value,
        result.where,
        result.attempts,
        result.duration_ms,
        None if result.output is None else json.dumps(result.output, sort_keys=True),
        evidence.served_version if evidence else None,
        evidence.time_unix_ms if evidence else None,
        evidence.sha256 if evidence else None,
        int(result.remembered),
        result.reason,
        result.message,
        json.dumps(list(result.notes)),
        result.confidence.value,
        json.dumps([_evidence_json(e) for e in result.sources]),
        json.dumps(list(result.candidates), sort_keys=True),
        int(result.asked_verification),
        int(result.may_have_written),
    )


def _evidence_json(evidence: Evidence) -> dict[str, Any]:
    return {
        "step_id": evidence.step_id,
        "where": evidence.where,
        "served_version": evidence.served_version,
        "time_unix_ms": evidence.time_unix_ms,
        "sha256": evidence.sha256,
    }


def _evidence_of(entry: dict[str, Any]) -> Evidence:
    return Evidence(
        str(entry["step_id"]),
        str(entry["where"]),
        str(entry["served_version"]),
        int(entry["time_unix_ms"]),
        str(entry["sha256"]),
    )


def stored_task(
    row: tuple[Any, ...], steps: list[tuple[Any, ...]], revisions: list[tuple[Any, ...]]
) -> StoredPlanTask:
    (
        task_id,
        plan_json,
        state,
        revision,
        reason,
        message,
        steps_used,
        peer_calls,
        elapsed,
        created,
        updated,
        tool_calls,
        on_behalf_of,
        user_issuer,
    ) = row
    return StoredPlanTask(
        task_id=task_id,
        plan=parse_plan(plan_json, f"task {task_id}"),
        state=PlanTaskState(state),
        revision=int(revision),
        reason=reason,
        message=message,
        steps={r[1]: step_result(r) for r in steps},
        revisions=tuple(RevisionRecord(int(r[0]), r[1], int(r[2])) for r in revisions),
        usage=Usage(int(steps_used), int(peer_calls), float(elapsed), int(tool_calls)),
        created_unix_ms=int(created),
        updated_unix_ms=int(updated),
        on_behalf_of=on_behalf_of,
        user_issuer=user_issuer,
    )


def step_result(row: tuple[Any, ...]) -> StepResult:
    (
        _,
        step_id,
        revision,
        status,
        where,
        attempts,
        duration_ms,
        output_json,
        served,
        time_ms,
        sha256,
        replayed,
        reason,
        message,
        notes_json,
        confidence,
        sources_json,
        candidates_json,
        asked_verification,
        may_have_written,
    ) = row
    evidence = (
        Evidence(step_id, where, served, int(time_ms), sha256) if sha256 is not None else None
    )
    return StepResult(
        step_id=step_id,
        status=StepStatus(status),
        revision=int(revision),
        where=where,
        attempts=int(attempts),
        duration_ms=float(duration_ms),
        output=None if output_json is None else json.loads(output_json),
        evidence=evidence,
        remembered=bool(replayed),
        reason=reason,
        message=message,
        notes=tuple(json.loads(notes_json)),
        confidence=Confidence(confidence),
        sources=tuple(_evidence_of(e) for e in json.loads(sources_json)),
        candidates=tuple(json.loads(candidates_json)),
        asked_verification=bool(asked_verification),
        may_have_written=bool(may_have_written),
    )


APPROVAL_COLUMNS = (
    "step_id, capability, where_, version, risk, input_sha256, fields_json, decision, "
    "decided_by, time_ms"
)
"""The approval columns after the task id (:func:`approval_row`, :func:`approval`)."""


def approval_row(request: ApprovalRequest) -> tuple[Any, ...]:
    """``request`` as the values of ``APPROVAL_COLUMNS``, in order."""
    return (
        request.step_id,
        request.capability,
        request.where,
        request.version,
        request.risk,
        request.input_sha256,
        json.dumps(request.fields, sort_keys=True),
        request.decision.value,
        request.decided_by,
        request.time_unix_ms,
    )


def approval(row: tuple[Any, ...]) -> ApprovalRequest:
    """An ``approvals`` row (``APPROVAL_COLUMNS``) as an ApprovalRequest."""
    step_id, capability, where, version, risk, digest, fields_json, decision, who, time_ms = row
    return ApprovalRequest(
        step_id=step_id,
        capability=capability,
        where=where,
        version=version,
        risk=risk,
        input_sha256=digest,
        fields={str(k): int(v) for k, v in json.loads(fields_json).items()},
        decision=Decision(decision),
        decided_by=who,
        time_unix_ms=int(time_ms),
    )


def failed_row(attempt: FailedAttempt) -> tuple[str, str, str]:
    """``attempt`` as the values of a ``failed_attempts`` row after its task id, in order."""
    return (attempt.step_id, attempt.where, attempt.input_sha256)


def failed_attempt(row: tuple[Any, ...]) -> FailedAttempt:
    """A ``failed_attempts`` row (without its task id) as a FailedAttempt."""
    step_id, where, digest = row
    return FailedAttempt(str(step_id), str(where), str(digest))


def pin_row(pin: WritePin) -> tuple[Any, ...]:
    """``pin`` as the values of a ``write_pins`` row after its task id, in order."""
    return (
        pin.step_id,
        pin.revision,
        pin.where,
        pin.idempotency_key,
        pin.version,
        pin.time_unix_ms,
    )


def write_pin(row: tuple[Any, ...]) -> WritePin:
    """A ``write_pins`` row (without its task id) as a WritePin."""
    step_id, revision, where, key, version, time_ms = row
    return WritePin(step_id, int(revision), where, key, version, int(time_ms))
