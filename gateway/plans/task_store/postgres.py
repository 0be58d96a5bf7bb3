"""``TaskStore`` in PostgreSQL: the tasks of one agent id, shared by its replicas.

The same checkpoints as :class:`gateway.plans.task_store.sqlite.SqliteTaskStore`, keyed by
(agent id, task id), so any replica can resume a task another one started.
Leases work as in SQLite: a lease row with an expiry, taken and checked in
the same transaction as the write it fences; the lease row (and, for a new
one, the task row) is locked ``FOR UPDATE`` so two replicas taking the same
task serialize, and exactly one wins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from gateway.errors import TaskLeased, TaskNotFound
from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest, Decision
from gateway.plans.task import RevisionRecord, StepResult, TaskState
from gateway.plans.task_store import rows
from gateway.plans.task_store.lease import Lease, may_take
from gateway.plans.task_store.records import FailedAttempt, StoredTask, Usage, WritePin
from gateway.plans.task_store.store import TaskStore
from gateway.postgres.pool import Connection, StatePool

_T = TypeVar("_T")
_TASK_COLUMNS = (
    "task_id, plan_json, state, revision, reason, message, steps_used, peer_calls, "
    "elapsed, created_ms, updated_ms, tool_calls"
)
_STEP_COLUMNS = (
    "task_id, step_id, revision, status, where_, attempts, duration_ms, output_json, "
    "served_version, time_ms, sha256, replayed, reason, message, notes_json, confidence, "
    "sources_json, candidates_json, asked_verification, may_have_written"
)
_UPSERT_STEP = (
    f"INSERT INTO task_steps (agent_id, {_STEP_COLUMNS}) VALUES ({', '.join(['%s'] * 21)}) "
    "ON CONFLICT (agent_id, task_id, step_id) DO UPDATE SET revision = excluded.revision, "
    "status = excluded.status, where_ = excluded.where_, attempts = excluded.attempts, "
    "duration_ms = excluded.duration_ms, output_json = excluded.output_json, "
    "served_version = excluded.served_version, time_ms = excluded.time_ms, "
    "sha256 = excluded.sha256, replayed = excluded.replayed, reason = excluded.reason, "
    "message = excluded.message, notes_json = excluded.notes_json, "
    "confidence = excluded.confidence, sources_json = excluded.sources_json, "
    "candidates_json = excluded.candidates_json, "
    "asked_verification = excluded.asked_verification, "
    "may_have_written = excluded.may_have_written "
    "WHERE excluded.revision >= task_steps.revision AND task_steps.status != 'completed'"
)


class PostgresTaskStore(TaskStore):
    """``TaskStore`` in the shared ``tasks``/``task_*`` tables, one agent id's rows."""

    def __init__(self, pool: StatePool, agent_id: str) -> None:
        """``agent_id``'s tasks, reached through ``pool`` (the factory's, "task store")."""
        self._pool = pool
        self._agent = agent_id

    async def _in_transaction(self, work: Callable[[Connection], _T]) -> _T:
        return await asyncio.to_thread(self._pool.run, work)

    async def _fenced(
        self, task_id: str, owner: str | None, work: Callable[[Connection], _T]
    ) -> _T:
        def run(conn: Connection) -> _T:
            if owner is not None:
                current = self._lease(conn, task_id, lock=True)
                if current is None or current.owner != owner:
                    holder = "nobody" if current is None else current.owner
                    raise TaskLeased(
                        f"task {task_id}: this process lost its lease (now held by {holder})"
                    )
            return work(conn)

        return await self._in_transaction(run)

    def _lease(self, conn: Connection, task_id: str, *, lock: bool = False) -> Lease | None:
        row = conn.execute(
            "SELECT owner, expires_ms FROM task_leases WHERE agent_id = %s AND task_id = %s"
            + (" FOR UPDATE" if lock else ""),
            (self._agent, task_id),
        ).fetchone()
        return None if row is None else Lease(str(row[0]), int(str(row[1])))

    def _write_lease(self, conn: Connection, task_id: str, owner: str, expires_ms: int) -> None:
        conn.execute(
            "INSERT INTO task_leases VALUES (%s, %s, %s, %s) ON CONFLICT (agent_id, task_id) "
            "DO UPDATE SET owner = excluded.owner, expires_ms = excluded.expires_ms",
            (self._agent, task_id, owner, expires_ms),
        )

    def _write_usage(self, conn: Connection, task_id: str, usage: Usage, now_ms: int) -> None:
        conn.execute(
            # Usage only grows: see gateway.plans.task_store.rows.write_usage.
            "UPDATE tasks SET steps_used = GREATEST(steps_used, %s), "
            "peer_calls = GREATEST(peer_calls, %s), elapsed = GREATEST(elapsed, %s), "
            "updated_ms = GREATEST(updated_ms, %s), tool_calls = GREATEST(tool_calls, %s) "
            "WHERE agent_id = %s AND task_id = %s",
            (
                usage.steps,
                usage.peer_calls,
                usage.elapsed_seconds,
                now_ms,
                usage.tool_calls,
                self._agent,
                task_id,
            ),
        )

    async def create(self, task_id: str, plan: Plan, now_ms: int) -> None:
        await self._in_transaction(
            lambda conn: conn.execute(
                f"INSERT INTO tasks (agent_id, {_TASK_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, 0, 'OK', '', 0, 0, 0.0, %s, %s, 0)",
                (self._agent, task_id, plan.to_json(), TaskState.CREATED.value, now_ms, now_ms),
            )
        )

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
        def work(conn: Connection) -> None:
            conn.execute(
                "UPDATE tasks SET state = %s, reason = %s, message = %s "
                "WHERE agent_id = %s AND task_id = %s",
                (state.value, reason, message, self._agent, task_id),
            )
            self._write_usage(conn, task_id, usage, now_ms)

        await self._fenced(task_id, owner, work)

    async def record_usage(self, task_id: str, usage: Usage, now_ms: int, *, owner: str) -> None:
        await self._fenced(
            task_id, owner, lambda conn: self._write_usage(conn, task_id, usage, now_ms)
        )

    async def revise(
        self, task_id: str, plan: Plan, record: RevisionRecord, *, owner: str | None = None
    ) -> None:
        def work(conn: Connection) -> None:
            conn.execute(
                "INSERT INTO task_revisions VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    self._agent,
                    task_id,
                    record.revision,
                    record.reason,
                    record.time_unix_ms,
                    plan.to_json(),
                ),
            )
            conn.execute(
                "UPDATE tasks SET plan_json = %s, revision = %s "
                "WHERE agent_id = %s AND task_id = %s",
                (plan.to_json(), record.revision, self._agent, task_id),
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
        row = (self._agent, *rows.step_row(task_id, result))

        def work(conn: Connection) -> bool:
            stored = conn.execute(_UPSERT_STEP, row).rowcount > 0
            if stored and failed is not None:
                conn.execute(
                    "INSERT INTO task_failed_attempts VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (self._agent, task_id, *rows.failed_row(failed)),
                )
            return stored

        return await self._fenced(task_id, owner, work)

    async def pin_write(self, task_id: str, pin: WritePin, usage: Usage, *, owner: str) -> None:
        def work(conn: Connection) -> None:
            conn.execute(
                "INSERT INTO task_write_pins VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (agent_id, task_id, step_id, revision) DO UPDATE SET "
                "where_ = excluded.where_, idempotency_key = excluded.idempotency_key, "
                "version = excluded.version, time_ms = excluded.time_ms",
                (self._agent, task_id, *rows.pin_row(pin)),
            )
            self._write_usage(conn, task_id, usage, pin.time_unix_ms)

        await self._fenced(task_id, owner, work)

    async def request_approval(self, task_id: str, request: ApprovalRequest, *, owner: str) -> None:
        await self._fenced(
            task_id, owner, lambda conn: self._write_approval(conn, task_id, request)
        )

    async def decide_approval(
        self, task_id: str, step_id: str, decision: Decision, who: str, now_ms: int
    ) -> ApprovalRequest:
        def work(conn: Connection) -> ApprovalRequest:
            current = self._lease(conn, task_id, lock=True)
            if current is not None and current.expires_unix_ms > now_ms:
                raise TaskLeased(
                    f"task {task_id} is being run by {current.owner}; decide once it waits"
                )
            row = conn.execute(
                f"SELECT {rows.APPROVAL_COLUMNS} FROM task_approvals "
                "WHERE agent_id = %s AND task_id = %s AND step_id = %s FOR UPDATE",
                (self._agent, task_id, step_id),
            ).fetchone()
            if row is None or rows.approval(_any(row)).decision is not Decision.PENDING:
                raise TaskNotFound(f"task {task_id} has no step {step_id!r} waiting for approval")
            decided = rows.approval(_any(row)).decided(decision, who, now_ms)
            self._write_approval(conn, task_id, decided)
            return decided

        return await self._in_transaction(work)

    def _write_approval(self, conn: Connection, task_id: str, request: ApprovalRequest) -> None:
        conn.execute(
            f"INSERT INTO task_approvals (agent_id, task_id, {rows.APPROVAL_COLUMNS}) "
            f"VALUES ({', '.join(['%s'] * 12)}) ON CONFLICT (agent_id, task_id, step_id) "
            "DO UPDATE SET capability = excluded.capability, where_ = excluded.where_, "
            "version = excluded.version, risk = excluded.risk, "
            "input_sha256 = excluded.input_sha256, fields_json = excluded.fields_json, "
            "decision = excluded.decision, decided_by = excluded.decided_by, "
            "time_ms = excluded.time_ms",
            (self._agent, task_id, *rows.approval_row(request)),
        )

    async def take_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> None:
        def work(conn: Connection) -> None:
            # Locking the task row serializes replicas taking a task with no lease row yet.
            found = conn.execute(
                "SELECT 1 FROM tasks WHERE agent_id = %s AND task_id = %s FOR UPDATE",
                (self._agent, task_id),
            ).fetchone()
            if found is None:
                raise TaskNotFound(f"no task {task_id!r} in this agent's task store")
            current = self._lease(conn, task_id, lock=True)
            if not may_take(current, owner, now_ms):
                assert current is not None
                left = (current.expires_unix_ms - now_ms) / 1000
                raise TaskLeased(
                    f"task {task_id} is being run by {current.owner} (lease live for "
                    f"another {left:.1f}s); resume it once that process has ended"
                )
            self._write_lease(conn, task_id, owner, now_ms + int(seconds * 1000))

        await self._in_transaction(work)

    async def renew_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> bool:
        def work(conn: Connection) -> bool:
            current = self._lease(conn, task_id, lock=True)
            if current is None or current.owner != owner:
                return False
            self._write_lease(conn, task_id, owner, now_ms + int(seconds * 1000))
            return True

        return await self._in_transaction(work)

    async def release_lease(self, task_id: str, owner: str) -> None:
        await self._in_transaction(
            lambda conn: conn.execute(
                "DELETE FROM task_leases WHERE agent_id = %s AND task_id = %s AND owner = %s",
                (self._agent, task_id, owner),
            )
        )

    async def load(self, task_id: str) -> StoredTask:
        def work(conn: Connection) -> StoredTask:
            key = (self._agent, task_id)
            row = conn.execute(
                f"SELECT {_TASK_COLUMNS} FROM tasks WHERE agent_id = %s AND task_id = %s", key
            ).fetchone()
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in this agent's task store")
            steps = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM task_steps WHERE agent_id = %s AND task_id = %s",
                key,
            ).fetchall()
            revisions = conn.execute(
                "SELECT revision, reason, time_ms FROM task_revisions "
                "WHERE agent_id = %s AND task_id = %s ORDER BY revision",
                key,
            ).fetchall()
            pins = conn.execute(
                "SELECT step_id, revision, where_, idempotency_key, version, time_ms "
                "FROM task_write_pins WHERE agent_id = %s AND task_id = %s ORDER BY revision",
                key,
            ).fetchall()
            approvals = conn.execute(
                f"SELECT {rows.APPROVAL_COLUMNS} FROM task_approvals "
                "WHERE agent_id = %s AND task_id = %s",
                key,
            ).fetchall()
            failed = conn.execute(
                "SELECT step_id, where_, input_sha256 FROM task_failed_attempts "
                "WHERE agent_id = %s AND task_id = %s",
                key,
            ).fetchall()
            stored = rows.stored_task(_any(row), _all(steps), _all(revisions))
            latest = {str(r[0]): rows.write_pin(_any(r)) for r in pins}
            asked = {str(r[0]): rows.approval(_any(r)) for r in approvals}
            return replace(
                stored,
                pins=latest,
                lease=self._lease(conn, task_id),
                approvals=asked,
                failed_attempts=frozenset(rows.failed_attempt(_any(r)) for r in failed),
            )

        return await self._in_transaction(work)

    async def list(self, limit: int = 100) -> list[StoredTask]:
        found = await self._in_transaction(
            lambda conn: conn.execute(
                "SELECT task_id FROM tasks WHERE agent_id = %s "
                "ORDER BY updated_ms DESC, task_id LIMIT %s",
                (self._agent, limit),
            ).fetchall()
        )
        return [await self.load(str(r[0])) for r in found]

    def close(self) -> None:
        self._pool.close()


def _any(row: tuple[object, ...]) -> tuple[Any, ...]:
    return row


def _all(found: list[tuple[object, ...]]) -> list[tuple[Any, ...]]:
    return list(found)
