"""Checkpoints of tasks: plan, revisions, step results, evidence, usage, write pins, leases.

``TaskStore`` is the interface; ``SqliteTaskStore`` keeps it in one SQLite file
(WAL, synchronous=NORMAL) so an agent restarted mid-task resumes without
re-running completed steps. Step outputs are the agent's own data and are
kept for resume; nothing here is logged.

Writes made while a task runs name the lease ``owner`` (see ``gateway.plans.lease``):
they are fenced, i.e. refused with ``TaskLeased`` in the same transaction if
another process has taken the task over.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from gateway.errors import AuditUnavailable, TaskLeased, TaskNotFound
from gateway.plans.lease import Lease, may_take
from gateway.plans.model import Plan, parse_plan
from gateway.plans.task import Evidence, RevisionRecord, StepResult, StepStatus, TaskState


@dataclass(frozen=True, slots=True)
class Usage:
    """Budget consumed so far (survives restarts).

    ``elapsed_seconds`` is as of the checkpoint's ``updated_unix_ms``.
    """

    steps: int = 0
    peer_calls: int = 0
    elapsed_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class WritePin:
    """Where a write step's attempt went, recorded *before* it is sent.

    A resumed task sends that step only there again, with the same key.

    Attributes:
        step_id: The step.
        revision: Its revision (the key changes with it).
        where: ``"local"`` or the peer's SPIFFE ID.
        idempotency_key: The key the attempt carries.
        version: The version asked for.
        time_unix_ms: When it was recorded.
    """

    step_id: str
    revision: int
    where: str
    idempotency_key: str
    version: str
    time_unix_ms: int


@dataclass(frozen=True, slots=True)
class StoredTask:
    """Everything checkpointed about one task."""

    task_id: str
    plan: Plan
    state: TaskState
    revision: int
    reason: str
    message: str
    steps: dict[str, StepResult]
    revisions: tuple[RevisionRecord, ...]
    usage: Usage
    created_unix_ms: int
    updated_unix_ms: int
    pins: dict[str, WritePin] = field(default_factory=dict)
    lease: Lease | None = None


class TaskStore(ABC):
    """Durable task checkpoints."""

    @abstractmethod
    async def create(self, task_id: str, plan: Plan, now_ms: int) -> None:
        """Record a new task in state ``created`` at revision 0."""

    @abstractmethod
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
        """Record a state change and the budget used (fenced by ``owner``'s lease if given)."""

    @abstractmethod
    async def record_usage(self, task_id: str, usage: Usage, now_ms: int, *, owner: str) -> None:
        """Checkpoint the budget used (fenced: TaskLeased if ``owner`` lost the lease)."""

    @abstractmethod
    async def revise(
        self, task_id: str, plan: Plan, record: RevisionRecord, *, owner: str | None = None
    ) -> None:
        """Replace the plan with revision ``record.revision`` and record why."""

    @abstractmethod
    async def record_step(
        self, task_id: str, result: StepResult, *, owner: str | None = None
    ) -> bool:
        """Store a step result unless a newer revision or a completion is already stored.

        Returns True if it was stored.
        """

    @abstractmethod
    async def pin_write(self, task_id: str, pin: WritePin, usage: Usage, *, owner: str) -> None:
        """Durably record where a write attempt goes, with the usage, before it is sent.

        The latest pin of a step revision wins (a write moves only after an answer
        proved nothing ran where it went before). Fenced: TaskLeased if ``owner``
        lost the lease, and then nothing may be sent.
        """

    @abstractmethod
    async def take_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> None:
        """Take (or renew) the task's lease for ``owner`` until ``now_ms + seconds``.

        Raises:
            TaskNotFound: no such task.
            TaskLeased: another owner's lease is live.
        """

    @abstractmethod
    async def renew_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> bool:
        """Extend ``owner``'s lease; False if it is no longer ``owner``'s."""

    @abstractmethod
    async def release_lease(self, task_id: str, owner: str) -> None:
        """End ``owner``'s lease (nothing if it is not ``owner``'s)."""

    @abstractmethod
    async def load(self, task_id: str) -> StoredTask:
        """The checkpoint of ``task_id``; TaskNotFound if none."""

    @abstractmethod
    async def list(self, limit: int = 100) -> list[StoredTask]:
        """Most recently updated tasks first."""

    @abstractmethod
    def close(self) -> None:
        """Release the store."""


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tasks (task_id TEXT PRIMARY KEY, plan_json TEXT NOT NULL, "
    "state TEXT NOT NULL, revision INTEGER NOT NULL, reason TEXT NOT NULL, "
    "message TEXT NOT NULL, steps_used INTEGER NOT NULL, peer_calls INTEGER NOT NULL, "
    "elapsed REAL NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS steps (task_id TEXT NOT NULL, step_id TEXT NOT NULL, "
    "revision INTEGER NOT NULL, status TEXT NOT NULL, where_ TEXT NOT NULL, "
    "attempts INTEGER NOT NULL, duration_ms REAL NOT NULL, output_json TEXT, "
    "served_version TEXT, time_ms INTEGER, sha256 TEXT, replayed INTEGER NOT NULL, "
    "reason TEXT NOT NULL, message TEXT NOT NULL, notes_json TEXT NOT NULL, "
    "PRIMARY KEY (task_id, step_id))",
    "CREATE TABLE IF NOT EXISTS revisions (task_id TEXT NOT NULL, revision INTEGER NOT NULL, "
    "reason TEXT NOT NULL, time_ms INTEGER NOT NULL, plan_json TEXT NOT NULL, "
    "PRIMARY KEY (task_id, revision))",
    "CREATE TABLE IF NOT EXISTS write_pins (task_id TEXT NOT NULL, step_id TEXT NOT NULL, "
    "revision INTEGER NOT NULL, where_ TEXT NOT NULL, idempotency_key TEXT NOT NULL, "
    "version TEXT NOT NULL, time_ms INTEGER NOT NULL, PRIMARY KEY (task_id, step_id, revision))",
    "CREATE TABLE IF NOT EXISTS leases (task_id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL)",
)

_T = TypeVar("_T")

# A late result of an older step revision, or anything after a completion, is dropped.
_UPSERT_STEP = (
    "INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(task_id, step_id) DO UPDATE SET revision = excluded.revision, "
    "status = excluded.status, where_ = excluded.where_, attempts = excluded.attempts, "
    "duration_ms = excluded.duration_ms, output_json = excluded.output_json, "
    "served_version = excluded.served_version, time_ms = excluded.time_ms, "
    "sha256 = excluded.sha256, replayed = excluded.replayed, reason = excluded.reason, "
    "message = excluded.message, notes_json = excluded.notes_json "
    "WHERE excluded.revision >= steps.revision AND steps.status != 'completed'"
)


class SqliteTaskStore(TaskStore):
    """``TaskStore`` in one SQLite file; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL survives a process crash (the restart case); after a
            # power loss the last results may be re-run, which the peers'
            # idempotency keys make harmless for writes.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            for statement in _SCHEMA:
                self._db.execute(statement)
        except sqlite3.Error as err:
            raise AuditUnavailable(f"task store {path}: {err}") from err

    async def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        def work() -> int:
            with self._lock:
                return self._db.execute(sql, params).rowcount

        return await asyncio.to_thread(work)

    async def create(self, task_id: str, plan: Plan, now_ms: int) -> None:
        await self._run(
            "INSERT INTO tasks VALUES (?, ?, ?, 0, 'OK', '', 0, 0, 0.0, ?, ?)",
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
                        _check_owner(self._db, task_id, owner)
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
            _write_usage(db, task_id, usage, now_ms)

        await self._fenced(task_id, owner, work)

    async def record_usage(self, task_id: str, usage: Usage, now_ms: int, *, owner: str) -> None:
        await self._fenced(task_id, owner, lambda db: _write_usage(db, task_id, usage, now_ms))

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
        self, task_id: str, result: StepResult, *, owner: str | None = None
    ) -> bool:
        row = _step_row(task_id, result)
        changed = await self._fenced(
            task_id, owner, lambda db: db.execute(_UPSERT_STEP, row).rowcount
        )
        return changed > 0

    async def pin_write(self, task_id: str, pin: WritePin, usage: Usage, *, owner: str) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO write_pins VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(task_id, step_id, revision) DO UPDATE SET where_ = excluded.where_, "
                "idempotency_key = excluded.idempotency_key, version = excluded.version, "
                "time_ms = excluded.time_ms",
                (
                    task_id,
                    pin.step_id,
                    pin.revision,
                    pin.where,
                    pin.idempotency_key,
                    pin.version,
                    pin.time_unix_ms,
                ),
            )
            _write_usage(db, task_id, usage, pin.time_unix_ms)

        await self._fenced(task_id, owner, work)

    async def take_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> None:
        def work(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise TaskNotFound(f"no task {task_id!r} in this agent's task store")
            current = _lease(db, task_id)
            if not may_take(current, owner, now_ms):
                assert current is not None
                left = (current.expires_unix_ms - now_ms) / 1000
                raise TaskLeased(
                    f"task {task_id} is being run by {current.owner} (lease live for "
                    f"another {left:.1f}s); resume it once that process has ended"
                )
            _write_lease(db, task_id, owner, now_ms + int(seconds * 1000))

        await self._fenced(task_id, None, work)

    async def renew_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            current = _lease(db, task_id)
            if current is None or current.owner != owner:
                return False
            _write_lease(db, task_id, owner, now_ms + int(seconds * 1000))
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
                lease = _lease(self._db, task_id)
            stored = _stored_task(row, steps, revisions)
            latest = {r[0]: WritePin(r[0], int(r[1]), r[2], r[3], r[4], int(r[5])) for r in pins}
            return replace(stored, pins=latest, lease=lease)

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


def _check_owner(db: sqlite3.Connection, task_id: str, owner: str) -> None:
    current = _lease(db, task_id)
    if current is None or current.owner != owner:
        holder = "nobody" if current is None else current.owner
        raise TaskLeased(f"task {task_id}: this process lost its lease (now held by {holder})")


def _lease(db: sqlite3.Connection, task_id: str) -> Lease | None:
    row = db.execute(
        "SELECT owner, expires_ms FROM leases WHERE task_id = ?", (task_id,)
    ).fetchone()
    return None if row is None else Lease(str(row[0]), int(row[1]))


def _write_lease(db: sqlite3.Connection, task_id: str, owner: str, expires_ms: int) -> None:
    db.execute(
        "INSERT INTO leases VALUES (?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
        "owner = excluded.owner, expires_ms = excluded.expires_ms",
        (task_id, owner, expires_ms),
    )


def _write_usage(db: sqlite3.Connection, task_id: str, usage: Usage, now_ms: int) -> None:
    db.execute(
        "UPDATE tasks SET steps_used = ?, peer_calls = ?, elapsed = ?, updated_ms = ? "
        "WHERE task_id = ?",
        (usage.steps, usage.peer_calls, usage.elapsed_seconds, now_ms, task_id),
    )


def _step_row(task_id: str, result: StepResult) -> tuple[Any, ...]:
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
        int(result.replayed),
        result.reason,
        result.message,
        json.dumps(list(result.notes)),
    )


def _stored_task(
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
    ) = row
    return StoredTask(
        task_id=task_id,
        plan=parse_plan(plan_json, f"task {task_id}"),
        state=TaskState(state),
        revision=int(revision),
        reason=reason,
        message=message,
        steps={r[1]: _step_result(r) for r in steps},
        revisions=tuple(RevisionRecord(int(r[0]), r[1], int(r[2])) for r in revisions),
        usage=Usage(int(steps_used), int(peer_calls), float(elapsed)),
        created_unix_ms=int(created),
        updated_unix_ms=int(updated),
    )


def _step_result(row: tuple[Any, ...]) -> StepResult:
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
        replayed=bool(replayed),
        reason=reason,
        message=message,
        notes=tuple(json.loads(notes_json)),
    )
