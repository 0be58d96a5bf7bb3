"""Checkpoints of plan tasks: plan, revisions, step results, evidence, usage, write pins,
leases, approval requests and decisions, and failed attempts (digests only).

:class:`PlanTaskStore` is the interface and the statements both backends run,
written once over a :class:`~gateway.sql.dialect.Dialect`: a SQLite file
(:mod:`~gateway.plans.store.sqlite`, an agent's ``tasks.sqlite``) or the
tables every replica of an agent id shares in PostgreSQL
(:mod:`~gateway.plans.store.postgres`, keyed by agent id, so any replica
can resume a task another one started). An agent restarted mid-task resumes
without re-running completed steps. Rows are laid out by
:mod:`~gateway.plans.store.rows`; the records are in
:mod:`~gateway.plans.store.records`. Step outputs are the agent's own data
and are kept for resume; nothing here is logged.

Writes made while a task runs name the lease ``owner`` (see
:mod:`gateway.plans.store.lease`): they are fenced, i.e. refused with
``TaskLeased`` in the same transaction if another process has taken the task
over. The lease is read, checked and written in the transaction of the write it
fences; where replicas run beside each other the lease row (and, for a new
lease, the task row) is locked ``FOR UPDATE``, so two replicas taking the same
task serialize and exactly one wins (a SQLite write transaction locks the file).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from gateway.errors import TaskLeased, TaskNotFound
from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest, Decision
from gateway.plans.store import rows
from gateway.plans.store.lease import Lease, may_take
from gateway.plans.store.records import FailedAttempt, StoredPlanTask, Usage, WritePin
from gateway.plans.task import PlanTaskState, RevisionRecord, StepResult
from gateway.sql.dialect import Dialect, SqlConnection

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PlanTaskTables:
    """The table names of one backend (the shared database prefixes ``task_``)."""

    steps: str
    revisions: str
    write_pins: str
    leases: str
    approvals: str
    failed_attempts: str
    tasks: str = "tasks"


def _updates(*columns: str) -> str:
    return ", ".join(f"{column} = excluded.{column}" for column in columns)


class _Statements:
    """Every statement of the store in one dialect (built once per store)."""

    def __init__(self, sql: Dialect, t: PlanTaskTables) -> None:
        task, mark = sql.where("task_id"), sql.mark
        key = sql.columns("task_id")
        self.create = (
            f"INSERT INTO {t.tasks} ({sql.columns(rows.TASK_COLUMNS)}) "
            f"VALUES ({sql.marks(len(sql.scope) + 3)}, 0, 'OK', '', 0, 0, 0.0, {mark}, {mark}, 0, "
            f"{mark}, {mark})"
        )
        self.set_state = (
            f"UPDATE {t.tasks} SET state = {mark}, reason = {mark}, message = {mark} WHERE {task}"
        )
        # Usage only grows: a snapshot taken before a later one may commit after it
        # (checkpoints run in worker threads), and must not undo what it recorded.
        self.usage = f"UPDATE {t.tasks} SET " + ", ".join(
            f"{column} = {sql.greatest}({column}, {mark})"
            for column in ("steps_used", "peer_calls", "elapsed", "updated_ms", "tool_calls")
        )
        self.usage += f" WHERE {task}"
        revision = sql.columns("task_id, revision, reason, time_ms, plan_json")
        self.revision = (
            f"INSERT INTO {t.revisions} ({revision}) VALUES ({sql.marks(len(sql.scope) + 5)})"
        )
        self.revise = f"UPDATE {t.tasks} SET plan_json = {mark}, revision = {mark} WHERE {task}"
        # A late result of an older step revision, or anything after a completion, is dropped.
        self.step = (
            f"INSERT INTO {t.steps} ({sql.columns(rows.STEP_COLUMNS)}) "
            f"VALUES ({sql.marks(len(sql.scope) + 20)}) "
            f"ON CONFLICT ({key}, step_id) DO UPDATE SET "
            + _updates(*rows.STEP_COLUMNS.split(", ")[2:])
            + f" WHERE excluded.revision >= {t.steps}.revision "
            f"AND {t.steps}.status != 'completed'"
        )
        self.failed = (
            f"INSERT INTO {t.failed_attempts} ({key}, {rows.FAILED_COLUMNS}) "
            f"VALUES ({sql.marks(len(sql.scope) + 4)}) ON CONFLICT DO NOTHING"
        )
        self.pin = (
            f"INSERT INTO {t.write_pins} ({key}, {rows.PIN_COLUMNS}) "
            f"VALUES ({sql.marks(len(sql.scope) + 7)}) "
            f"ON CONFLICT ({key}, step_id, revision) DO UPDATE SET "
            + _updates("where_", "idempotency_key", "version", "time_ms")
        )
        self.approval = (
            f"INSERT INTO {t.approvals} ({key}, {rows.APPROVAL_COLUMNS}) "
            f"VALUES ({sql.marks(len(sql.scope) + 11)}) ON CONFLICT ({key}, step_id) "
            "DO UPDATE SET " + _updates(*rows.APPROVAL_COLUMNS.split(", ")[1:])
        )
        self.pending_approval = (
            f"SELECT {rows.APPROVAL_COLUMNS} FROM {t.approvals} "
            f"WHERE {sql.where('task_id', 'step_id')}{sql.lock_rows}"
        )
        self.lease = f"SELECT owner, expires_ms FROM {t.leases} WHERE {task}"
        self.locked_lease = self.lease + sql.lock_rows
        self.write_lease = (
            f"INSERT INTO {t.leases} ({key}, owner, expires_ms) "
            f"VALUES ({sql.marks(len(sql.scope) + 3)}) "
            f"ON CONFLICT ({key}) DO UPDATE SET " + _updates("owner", "expires_ms")
        )
        self.locked_task = f"SELECT 1 FROM {t.tasks} WHERE {task}{sql.lock_rows}"
        self.release = f"DELETE FROM {t.leases} WHERE {sql.where('task_id', 'owner')}"
        self.task = f"SELECT {rows.TASK_COLUMNS} FROM {t.tasks} WHERE {task}"
        self.steps = f"SELECT {rows.STEP_COLUMNS} FROM {t.steps} WHERE {task}"
        self.revisions = (
            f"SELECT revision, reason, time_ms FROM {t.revisions} WHERE {task} ORDER BY revision"
        )
        self.pins = f"SELECT {rows.PIN_COLUMNS} FROM {t.write_pins} WHERE {task} ORDER BY revision"
        self.approvals = f"SELECT {rows.APPROVAL_COLUMNS} FROM {t.approvals} WHERE {task}"
        self.failed_attempts = f"SELECT {rows.FAILED_COLUMNS} FROM {t.failed_attempts} WHERE {task}"
        scope = f" WHERE {sql.where()}" if sql.scope else ""
        self.latest = (
            f"SELECT task_id FROM {t.tasks}{scope} ORDER BY updated_ms DESC, task_id LIMIT {mark}"
        )


class PlanTaskStore(ABC):
    """Durable task checkpoints; safe to share between threads.

    Args:
        sql: The backend's dialect.
        tables: The backend's table names.
        scope: The values of ``sql.scope`` (the agent id in the shared tables).
    """

    def __init__(self, sql: Dialect, tables: PlanTaskTables, scope: tuple[str, ...] = ()) -> None:
        self._sql = _Statements(sql, tables)
        self._scope = scope

    @abstractmethod
    def _transaction(self, work: Callable[[SqlConnection], _T], *, writes: bool = True) -> _T:
        """``work`` in one transaction on the backend's connection, in this thread
        (``writes``: it changes rows, so a SQLite file is locked for writing from the start).

        Raises:
            StateUnavailable: the shared database failed the transaction.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the store."""

    async def create(
        self, task_id: str, plan: Plan, now_ms: int, user: tuple[str, str] = ("", "")
    ) -> None:
        """Record a new task in state ``created`` at revision 0.

        ``user``: the (subject, issuer) of the user the task acts for, or two
        empty strings; kept so a resume can only act for that same user.
        """
        values = (
            *self._scope,
            task_id,
            plan.to_json(),
            PlanTaskState.CREATED.value,
            now_ms,
            now_ms,
            *user,
        )
        await self._in_transaction(lambda conn: conn.execute(self._sql.create, values))

    async def set_state(
        self,
        task_id: str,
        state: PlanTaskState,
        usage: Usage,
        now_ms: int,
        reason: str,
        message: str,
        *,
        owner: str | None = None,
    ) -> None:
        """Record a state change and the budget used (fenced by ``owner``'s lease if given)."""

        def work(conn: SqlConnection) -> None:
            key = (*self._scope, task_id)
            conn.execute(self._sql.set_state, (state.value, reason, message, *key))
            self._write_usage(conn, task_id, usage, now_ms)

        await self._fenced(task_id, owner, work)

    async def record_usage(self, task_id: str, usage: Usage, now_ms: int, *, owner: str) -> None:
        """Checkpoint the budget used (fenced: TaskLeased if ``owner`` lost the lease)."""
        await self._fenced(
            task_id, owner, lambda conn: self._write_usage(conn, task_id, usage, now_ms)
        )

    async def revise(
        self, task_id: str, plan: Plan, record: RevisionRecord, *, owner: str | None = None
    ) -> None:
        """Replace the plan with revision ``record.revision`` and record why."""
        key = (*self._scope, task_id)

        def work(conn: SqlConnection) -> None:
            revision = (record.revision, record.reason, record.time_unix_ms, plan.to_json())
            conn.execute(self._sql.revision, (*key, *revision))
            conn.execute(self._sql.revise, (plan.to_json(), record.revision, *key))

        await self._fenced(task_id, owner, work)

    async def record_step(
        self,
        task_id: str,
        result: StepResult,
        *,
        owner: str | None = None,
        failed: FailedAttempt | None = None,
    ) -> bool:
        """Store a step result unless a newer revision or a completion is already stored.

        ``failed`` (the attempt ``result`` reports as failed) is remembered in the
        same transaction when the result is stored, so a crash cannot keep one
        without the other.

        Returns True if it was stored.
        """
        row = (*self._scope, *rows.step_row(task_id, result))

        def work(conn: SqlConnection) -> bool:
            stored = conn.execute(self._sql.step, row).rowcount > 0
            if stored and failed is not None:
                conn.execute(self._sql.failed, (*self._scope, task_id, *rows.failed_row(failed)))
            return stored

        return await self._fenced(task_id, owner, work)

    async def pin_write(self, task_id: str, pin: WritePin, usage: Usage, *, owner: str) -> None:
        """Durably record where a write attempt goes, with the usage, before it is sent.

        The latest pin of a step revision wins (a write moves only after an answer
        proved nothing ran where it went before). Fenced: TaskLeased if ``owner``
        lost the lease, and then nothing may be sent.
        """

        def work(conn: SqlConnection) -> None:
            conn.execute(self._sql.pin, (*self._scope, task_id, *rows.pin_row(pin)))
            self._write_usage(conn, task_id, usage, pin.time_unix_ms)

        await self._fenced(task_id, owner, work)

    async def request_approval(self, task_id: str, request: ApprovalRequest, *, owner: str) -> None:
        """Store ``request`` (pending) as the step's latest approval request, replacing
        any older request or decision of that step. Fenced by ``owner``'s lease."""
        await self._fenced(
            task_id, owner, lambda conn: self._write_approval(conn, task_id, request)
        )

    async def decide_approval(
        self, task_id: str, step_id: str, decision: Decision, who: str, now_ms: int
    ) -> ApprovalRequest:
        """Approve or deny the step's pending request; returns it as decided.

        Refused (the store is unchanged) while a live lease is held: a decision is
        taken only on a task no process runs.

        Raises:
            TaskNotFound: no such task, or no pending request for ``step_id``.
            TaskLeased: a process is running the task.
        """

        def work(conn: SqlConnection) -> ApprovalRequest:
            current = self._lease(conn, task_id, lock=True)
            if current is not None and current.expires_unix_ms > now_ms:
                raise TaskLeased(
                    f"task {task_id} is being run by {current.owner}; decide once it waits"
                )
            key = (*self._scope, task_id, step_id)
            row = conn.execute(self._sql.pending_approval, key).fetchone()
            if row is None or rows.approval(row).decision is not Decision.PENDING:
                raise TaskNotFound(f"task {task_id} has no step {step_id!r} waiting for approval")
            decided = rows.approval(row).decided(decision, who, now_ms)
            self._write_approval(conn, task_id, decided)
            return decided

        return await self._in_transaction(work)

    async def take_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> None:
        """Take (or renew) the task's lease for ``owner`` until ``now_ms + seconds``.

        Raises:
            TaskNotFound: no such task.
            TaskLeased: another owner's lease is live.
        """

        def work(conn: SqlConnection) -> None:
            # Locking the task row serializes replicas taking a task with no lease row yet.
            if conn.execute(self._sql.locked_task, (*self._scope, task_id)).fetchone() is None:
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
        """Extend ``owner``'s lease; False if it is no longer ``owner``'s."""

        def work(conn: SqlConnection) -> bool:
            current = self._lease(conn, task_id, lock=True)
            if current is None or current.owner != owner:
                return False
            self._write_lease(conn, task_id, owner, now_ms + int(seconds * 1000))
            return True

        return await self._in_transaction(work)

    async def release_lease(self, task_id: str, owner: str) -> None:
        """End ``owner``'s lease (nothing if it is not ``owner``'s)."""
        key = (*self._scope, task_id, owner)
        await self._in_transaction(lambda conn: conn.execute(self._sql.release, key))

    async def load(self, task_id: str) -> StoredPlanTask:
        """The checkpoint of ``task_id`` (one snapshot); TaskNotFound if none."""
        key = (*self._scope, task_id)

        def work(conn: SqlConnection) -> StoredPlanTask:
            row = conn.execute(self._sql.task, key).fetchone()
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in this agent's task store")
            steps = conn.execute(self._sql.steps, key).fetchall()
            revisions = conn.execute(self._sql.revisions, key).fetchall()
            pins = conn.execute(self._sql.pins, key).fetchall()
            approvals = conn.execute(self._sql.approvals, key).fetchall()
            failed = conn.execute(self._sql.failed_attempts, key).fetchall()
            return replace(
                rows.stored_task(row, steps, revisions),
                pins={str(r[0]): rows.write_pin(r) for r in pins},
                lease=self._lease(conn, task_id),
                approvals={str(r[0]): rows.approval(r) for r in approvals},
                failed_attempts=frozenset(rows.failed_attempt(r) for r in failed),
            )

        return await self._in_transaction(work, writes=False)

    async def list(self, limit: int = 100) -> list[StoredPlanTask]:
        """Most recently updated tasks first."""
        found = await self._in_transaction(
            lambda conn: conn.execute(self._sql.latest, (*self._scope, limit)).fetchall(),
            writes=False,
        )
        return [await self.load(str(r[0])) for r in found]

    async def _in_transaction(
        self, work: Callable[[SqlConnection], _T], *, writes: bool = True
    ) -> _T:
        return await asyncio.to_thread(self._transaction, work, writes=writes)

    async def _fenced(
        self, task_id: str, owner: str | None, work: Callable[[SqlConnection], _T]
    ) -> _T:
        """``work`` in one transaction, after checking that ``owner`` (if any) holds the lease."""

        def run(conn: SqlConnection) -> _T:
            if owner is not None:
                current = self._lease(conn, task_id, lock=True)
                if current is None or current.owner != owner:
                    holder = "nobody" if current is None else current.owner
                    raise TaskLeased(
                        f"task {task_id}: this process lost its lease (now held by {holder})"
                    )
            return work(conn)

        return await self._in_transaction(run)

    def _lease(self, conn: SqlConnection, task_id: str, *, lock: bool = False) -> Lease | None:
        statement = self._sql.locked_lease if lock else self._sql.lease
        row = conn.execute(statement, (*self._scope, task_id)).fetchone()
        return None if row is None else Lease(str(row[0]), int(row[1]))

    def _write_lease(self, conn: SqlConnection, task_id: str, owner: str, expires_ms: int) -> None:
        conn.execute(self._sql.write_lease, (*self._scope, task_id, owner, expires_ms))

    def _write_usage(self, conn: SqlConnection, task_id: str, usage: Usage, now_ms: int) -> None:
        grown = (usage.steps, usage.peer_calls, usage.elapsed_seconds, now_ms, usage.tool_calls)
        conn.execute(self._sql.usage, (*grown, *self._scope, task_id))

    def _write_approval(self, conn: SqlConnection, task_id: str, request: ApprovalRequest) -> None:
        conn.execute(self._sql.approval, (*self._scope, task_id, *rows.approval_row(request)))
