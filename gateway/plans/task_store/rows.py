"""How ``SqliteTaskStore`` lays tasks out in SQLite: the schema, and rows to and from
checkpoint records. Called with the store's lock held, inside its transactions."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gateway.errors import TaskLeased
from gateway.plans.document.model import parse_plan
from gateway.plans.execution.approval import ApprovalRequest, Decision
from gateway.plans.execution.verification import Confidence
from gateway.plans.task import Evidence, RevisionRecord, StepResult, StepStatus, TaskState
from gateway.plans.task_store.lease import Lease
from gateway.plans.task_store.records import FailedAttempt, StoredTask, Usage, WritePin

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tasks (task_id TEXT PRIMARY KEY, plan_json TEXT NOT NULL, "
    "state TEXT NOT NULL, revision INTEGER NOT NULL, reason TEXT NOT NULL, "
    "message TEXT NOT NULL, steps_used INTEGER NOT NULL, peer_calls INTEGER NOT NULL, "
    "elapsed REAL NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, "
    "tool_calls INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS steps (task_id TEXT NOT NULL, step_id TEXT NOT NULL, "
    "revision INTEGER NOT NULL, status TEXT NOT NULL, where_ TEXT NOT NULL, "
    "attempts INTEGER NOT NULL, duration_ms REAL NOT NULL, output_json TEXT, "
    "served_version TEXT, time_ms INTEGER, sha256 TEXT, replayed INTEGER NOT NULL, "
    "reason TEXT NOT NULL, message TEXT NOT NULL, notes_json TEXT NOT NULL, "
    "confidence TEXT NOT NULL DEFAULT 'unverified', sources_json TEXT NOT NULL DEFAULT '[]', "
    "candidates_json TEXT NOT NULL DEFAULT '[]', asked_verification INTEGER NOT NULL DEFAULT 0, "
    "may_have_written INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (task_id, step_id))",
    "CREATE TABLE IF NOT EXISTS revisions (task_id TEXT NOT NULL, revision INTEGER NOT NULL, "
    "reason TEXT NOT NULL, time_ms INTEGER NOT NULL, plan_json TEXT NOT NULL, "
    "PRIMARY KEY (task_id, revision))",
    "CREATE TABLE IF NOT EXISTS write_pins (task_id TEXT NOT NULL, step_id TEXT NOT NULL, "
    "revision INTEGER NOT NULL, where_ TEXT NOT NULL, idempotency_key TEXT NOT NULL, "
    "version TEXT NOT NULL, time_ms INTEGER NOT NULL, PRIMARY KEY (task_id, step_id, revision))",
    "CREATE TABLE IF NOT EXISTS leases (task_id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS approvals (task_id TEXT NOT NULL, step_id TEXT NOT NULL, "
    "capability TEXT NOT NULL, where_ TEXT NOT NULL, version TEXT NOT NULL, risk TEXT NOT NULL, "
    "input_sha256 TEXT NOT NULL, fields_json TEXT NOT NULL, decision TEXT NOT NULL, "
    "decided_by TEXT NOT NULL, time_ms INTEGER NOT NULL, PRIMARY KEY (task_id, step_id))",
    # Added after release; IF NOT EXISTS creates it (empty) in a file made before.
    "CREATE TABLE IF NOT EXISTS failed_attempts (task_id TEXT NOT NULL, step_id TEXT NOT NULL, "
    "where_ TEXT NOT NULL, input_sha256 TEXT NOT NULL, "
    "PRIMARY KEY (task_id, step_id, where_, input_sha256))",
)

ADDED_COLUMNS = {
    "tasks": ("tool_calls INTEGER NOT NULL DEFAULT 0",),
    "steps": (
        "confidence TEXT NOT NULL DEFAULT 'unverified'",
        "sources_json TEXT NOT NULL DEFAULT '[]'",
        "candidates_json TEXT NOT NULL DEFAULT '[]'",
        "asked_verification INTEGER NOT NULL DEFAULT 0",
        "may_have_written INTEGER NOT NULL DEFAULT 0",
    ),
}
"""Columns added after a table was first released, appended to files made before."""

LEGACY_WRITTEN_NOTE_SQL = (
    "notes_json LIKE '%: the write may have run there and its outcome is unknown, "
    "so it is not sent to another peer\"%'"
)
"""Step rows whose notes hold the 'may have written' note: how rows written before the
flag was a column of their own are filled (the note's wording of those releases)."""

BACKFILLS = {
    "may_have_written": f"UPDATE steps SET may_have_written = 1 WHERE {LEGACY_WRITTEN_NOTE_SQL}"
}
"""Rows of an older release that a new column must describe too, filled when it is added."""


def add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a task store made by an older release up to ``SCHEMA`` (columns go last)."""
    for table, columns in ADDED_COLUMNS.items():
        present = {str(row[1]) for row in db.execute(f"PRAGMA table_info({table})")}
        for column in columns:
            name = column.split()[0]
            if name not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                if name in BACKFILLS:
                    db.execute(BACKFILLS[name])


# A late result of an older step revision, or anything after a completion, is dropped.
UPSERT_STEP = (
    "INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(task_id, step_id) DO UPDATE SET revision = excluded.revision, "
    "status = excluded.status, where_ = excluded.where_, attempts = excluded.attempts, "
    "duration_ms = excluded.duration_ms, output_json = excluded.output_json, "
    "served_version = excluded.served_version, time_ms = excluded.time_ms, "
    "sha256 = excluded.sha256, replayed = excluded.replayed, reason = excluded.reason, "
    "message = excluded.message, notes_json = excluded.notes_json, "
    "confidence = excluded.confidence, sources_json = excluded.sources_json, "
    "candidates_json = excluded.candidates_json, "
    "asked_verification = excluded.asked_verification, "
    "may_have_written = excluded.may_have_written "
    "WHERE excluded.revision >= steps.revision AND steps.status != 'completed'"
)


def check_owner(db: sqlite3.Connection, task_id: str, owner: str) -> None:
    current = lease(db, task_id)
    if current is None or current.owner != owner:
        holder = "nobody" if current is None else current.owner
        raise TaskLeased(f"task {task_id}: this process lost its lease (now held by {holder})")


def lease(db: sqlite3.Connection, task_id: str) -> Lease | None:
    row = db.execute(
        "SELECT owner, expires_ms FROM leases WHERE task_id = ?", (task_id,)
    ).fetchone()
    return None if row is None else Lease(str(row[0]), int(row[1]))


def write_lease(db: sqlite3.Connection, task_id: str, owner: str, expires_ms: int) -> None:
    db.execute(
        "INSERT INTO leases VALUES (?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
        "owner = excluded.owner, expires_ms = excluded.expires_ms",
        (task_id, owner, expires_ms),
    )


def write_usage(db: sqlite3.Connection, task_id: str, usage: Usage, now_ms: int) -> None:
    # Usage only grows: a snapshot taken before a later one may commit after it
    # (checkpoints run in worker threads), and must not undo what it recorded.
    db.execute(
        "UPDATE tasks SET steps_used = MAX(steps_used, ?), peer_calls = MAX(peer_calls, ?), "
        "elapsed = MAX(elapsed, ?), updated_ms = MAX(updated_ms, ?), "
        "tool_calls = MAX(tool_calls, ?) WHERE task_id = ?",
        (usage.steps, usage.peer_calls, usage.elapsed_seconds, now_ms, usage.tool_calls, task_id),
    )


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
) -> StoredTask:
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
    ) = row
    return StoredTask(
        task_id=task_id,
        plan=parse_plan(plan_json, f"task {task_id}"),
        state=TaskState(state),
        revision=int(revision),
        reason=reason,
        message=message,
        steps={r[1]: step_result(r) for r in steps},
        revisions=tuple(RevisionRecord(int(r[0]), r[1], int(r[2])) for r in revisions),
        usage=Usage(int(steps_used), int(peer_calls), float(elapsed), int(tool_calls)),
        created_unix_ms=int(created),
        updated_unix_ms=int(updated),
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


def write_approval(db: sqlite3.Connection, task_id: str, request: ApprovalRequest) -> None:
    """Store ``request`` as the step's latest approval request (replacing an older one)."""
    db.execute(
        f"INSERT OR REPLACE INTO approvals (task_id, {APPROVAL_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (task_id, *approval_row(request)),
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


INSERT_FAILED_ATTEMPT = "INSERT OR IGNORE INTO failed_attempts VALUES (?, ?, ?, ?)"


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
