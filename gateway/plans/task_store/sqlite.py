"""Checkpoints of tasks: plan, revisions, step results, evidence, usage, write pins, leases,
approval requests and decisions, and failed attempts (digests only).

``TaskStore`` is the interface; ``SqliteTaskStore`` keeps it in one SQLite file
(WAL, synchronous=NORMAL; layout in ``gateway.plans.task_store.rows``, the records in
``gateway.plans.task_store.records``) so an agent restarted mid-task resumes without
re-running completed steps. Step outputs are the agent's own data and are
kept for resume; nothing here is logged.

Writes made while a task runs name the lease ``owner`` (see ``gateway.plans.task_store.lease``):
they are fenced, i.e. refused with ``TaskLeased`` in the same transaction if
another process has taken the task over.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from gateway.errors import AuditUnavailable, TaskLeased, TaskNotFound
from gateway.local.private_files import connect_private
from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest, Decision
from gateway.plans.task import RevisionRecord, StepResult, TaskState
from gateway.plans.task_store import rows
from gateway.plans.task_store.lease import may_take
from gateway.plans.task_store.records import FailedAttempt, StoredTask, Usage, WritePin
from gateway.plans.task_store.store import TaskStore

__all__ = ["FailedAttempt", "SqliteTaskStore", "StoredTask", "Usage", "WritePin"]

_T = TypeVar("_T")


class SqliteTaskStore(TaskStore):
    """``TaskStore`` in one SQLite file; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        try:
            self._db = connect_private(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL survives a process crash (the restart case); after a
            # power loss the last results may be re-run, which the peers'
            # idempotency keys make harmless for writes.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            for statement in rows.SCHEMA:
                self._db.execute(statement)
            rows.add_missing_columns(self._db)
        except sqlite3.Error as err:
            raise AuditUnavailable(f"task store {path}: {err}") from err

    async def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        def work() -> int:
            with self._lock:
                return self._db.execute(sql, params).rowcount

        return await asyncio.to_thread(work)

    async def create(self, task_id: str, plan: Plan, now_ms: int) -> None:
        await self._run(
            "INSERT INTO tasks VALUES (?, ?, ?, 0, 'OK', '', 0, 0, 0.0, ?, ?, 0)",
            (task_id, plan.to_json(), TaskState.CREATED.value, now_ms, now_ms),
        )

    async def _fenced(
        self, task_id: str, owner: str | None, work: Callable[[sqlite3.Connection], _T]
    ) -> _T:
        """``work`` in one transaction, after checking that ``owner`` (if any) holds the lease."""

        def run() -> _T:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    if owner is not None:
                        rows.check_owner(self._db, task_id, owner)
                    answer = work(self._db)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                return answer

        return await asyncio.to_thread(run)

    async def set_state(
        self,
        task_id: str,
        state: TaskState,
        usage: Usage,
        now_ms: int,
        reason: str,
        message: str,
        *,
        owner: str | None = None,
    ) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE tasks SET state = ?, reason = ?, message = ? WHERE task_id = ?",
                (state.value, reason, message, task_id),
            )
            rows.write_usage(db, task_id, usage, now_ms)

        await self._fenced(task_id, owner, work)

    async def record_usage(self, task_id: str, usage: Usage, now_ms: int, *, owner: str) -> None:
        await self._fenced(task_id, owner, lambda db: rows.write_usage(db, task_id, usage, now_ms))

    async def revise(
        self, task_id: str, plan: Plan, record: RevisionRecord, *, owner: str | None = None
    ) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO revisions VALUES (?, ?, ?, ?, ?)",
                (task_id, record.revision, record.reason, record.time_unix_ms, plan.to_json()),
            )
            db.execute(
                "UPDATE tasks SET plan_json = ?, revision = ? WHERE task_id = ?",
                (plan.to_json(), record.revision, task_id),
            )

        await self._fenced(task_id, owner, work)

    async def record_step(
        self,
        task_id: str,
        result: StepResult,
        *,
        owner: str | None = None,
        failed: FailedAttempt | None = None,
    ) -> bool:
        row = rows.step_row(task_id, result)

        def work(db: sqlite3.Connection) -> bool:
            stored = db.execute(rows.UPSERT_STEP, row).rowcount > 0
            if stored and failed is not None:
                db.execute(rows.INSERT_FAILED_ATTEMPT, (task_id, *rows.failed_row(failed)))
            return stored

        return await self._fenced(task_id, owner, work)

    async def pin_write(self, task_id: str, pin: WritePin, usage: Usage, *, owner: str) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO write_pins VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(task_id, step_id, revision) DO UPDATE SET where_ = excluded.where_, "
                "idempotency_key = excluded.idempotency_key, version = excluded.version, "
                "time_ms = excluded.time_ms",
                (task_id, *rows.pin_row(pin)),
            )
            rows.write_usage(db, task_id, usage, pin.time_unix_ms)

        await self._fenced(task_id, owner, work)

    async def request_approval(self, task_id: str, request: ApprovalRequest, *, owner: str) -> None:
        await self._fenced(task_id, owner, lambda db: rows.write_approval(db, task_id, request))

    async def decide_approval(
        self, task_id: str, step_id: str, decision: Decision, who: str, now_ms: int
    ) -> ApprovalRequest:
        def work(db: sqlite3.Connection) -> ApprovalRequest:
            current = rows.lease(db, task_id)
            if current is not None and current.expires_unix_ms > now_ms:
                raise TaskLeased(
                    f"task {task_id} is being run by {current.owner}; decide once it waits"
                )
            row = db.execute(
                f"SELECT {rows.APPROVAL_COLUMNS} FROM approvals WHERE task_id = ? AND step_id = ?",
                (task_id, step_id),
            ).fetchone()
            if row is None or rows.approval(row).decision is not Decision.PENDING:
                raise TaskNotFound(f"task {task_id} has no step {step_id!r} waiting for approval")
            decided = rows.approval(row).decided(decision, who, now_ms)
            rows.write_approval(db, task_id, decided)
            return decided

        return await self._fenced(task_id, None, work)

    async def take_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> None:
        def work(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise TaskNotFound(f"no task {task_id!r} in this agent's task store")
            current = rows.lease(db, task_id)
            if not may_take(current, owner, now_ms):
                assert current is not None
                left = (current.expires_unix_ms - now_ms) / 1000
                raise TaskLeased(
                    f"task {task_id} is being run by {current.owner} (lease live for "
                    f"another {left:.1f}s); resume it once that process has ended"
                )
            rows.write_lease(db, task_id, owner, now_ms + int(seconds * 1000))

        await self._fenced(task_id, None, work)

    async def renew_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            current = rows.lease(db, task_id)
            if current is None or current.owner != owner:
                return False
            rows.write_lease(db, task_id, owner, now_ms + int(seconds * 1000))
            return True

        return await self._fenced(task_id, None, work)

    async def release_lease(self, task_id: str, owner: str) -> None:
        await self._run("DELETE FROM leases WHERE task_id = ? AND owner = ?", (task_id, owner))

    async def load(self, task_id: str) -> StoredTask:
        def work() -> StoredTask:
            with self._lock:
                row = self._db.execute(
                    "SELECT * FROM tasks WHERE task_id = ?", (task_id,)
                ).fetchone()
                if row is None:
                    raise TaskNotFound(f"no task {task_id!r} in this agent's task store")
                steps = self._db.execute(
                    "SELECT * FROM steps WHERE task_id = ?", (task_id,)
                ).fetchall()
                revisions = self._db.execute(
                    "SELECT revision, reason, time_ms FROM revisions WHERE task_id = ? "
                    "ORDER BY revision",
                    (task_id,),
                ).fetchall()
                pins = self._db.execute(
                    "SELECT step_id, revision, where_, idempotency_key, version, time_ms "
                    "FROM write_pins WHERE task_id = ? ORDER BY revision",
                    (task_id,),
                ).fetchall()
                lease = rows.lease(self._db, task_id)
                approvals = self._db.execute(
                    f"SELECT {rows.APPROVAL_COLUMNS} FROM approvals WHERE task_id = ?",
                    (task_id,),
                ).fetchall()
                failed = self._db.execute(
                    "SELECT step_id, where_, input_sha256 FROM failed_attempts WHERE task_id = ?",
                    (task_id,),
                ).fetchall()
            stored = rows.stored_task(row, steps, revisions)
            latest = {r[0]: rows.write_pin(r) for r in pins}
            asked = {r[0]: rows.approval(r) for r in approvals}
            return replace(
                stored,
                pins=latest,
                lease=lease,
                approvals=asked,
                failed_attempts=frozenset(rows.failed_attempt(r) for r in failed),
            )

        return await asyncio.to_thread(work)

    async def list(self, limit: int = 100) -> list[StoredTask]:
        def ids() -> list[str]:
            with self._lock:
                rows = self._db.execute(
                    "SELECT task_id FROM tasks ORDER BY updated_ms DESC, task_id LIMIT ?",
                    (limit,),
                ).fetchall()
            return [str(r[0]) for r in rows]

        return [await self.load(task_id) for task_id in await asyncio.to_thread(ids)]

    def close(self) -> None:
        with self._lock:
            self._db.close()
