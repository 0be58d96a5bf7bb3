"""Plan task checkpoints in one SQLite file (``tasks.sqlite``), shared by an agent's workers.

The statements are :class:`~gateway.plans.store.store.PlanTaskStore`'s; this
module holds the file: its schema (created, or brought up from an older release,
when it is opened), one connection and its lock, and the transaction (``BEGIN
IMMEDIATE`` for a write: the file's write lock, which fences a write against
another process taking the task's lease meanwhile). WAL with
``synchronous=NORMAL``: a checkpoint survives a crash of the process (the
restart case); after a power loss the last results may be re-run, which the
peers' idempotency keys make harmless for writes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gateway.errors import AuditUnavailable
from gateway.local.private_files import connect_private
from gateway.plans.store.records import FailedAttempt, StoredPlanTask, Usage, WritePin
from gateway.plans.store.store import PlanTaskStore, PlanTaskTables
from gateway.sql.dialect import SQLITE, SqlConnection

__all__ = ["FailedAttempt", "SqlitePlanTaskStore", "StoredPlanTask", "Usage", "WritePin"]

_T = TypeVar("_T")

TABLES = PlanTaskTables(
    steps="steps",
    revisions="revisions",
    write_pins="write_pins",
    leases="leases",
    approvals="approvals",
    failed_attempts="failed_attempts",
)
"""The tables of a task file."""

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tasks (task_id TEXT PRIMARY KEY, plan_json TEXT NOT NULL, "
    "state TEXT NOT NULL, revision INTEGER NOT NULL, reason TEXT NOT NULL, "
    "message TEXT NOT NULL, steps_used INTEGER NOT NULL, peer_calls INTEGER NOT NULL, "
    "elapsed REAL NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, "
    "tool_calls INTEGER NOT NULL DEFAULT 0, on_behalf_of TEXT NOT NULL DEFAULT '', "
    "user_issuer TEXT NOT NULL DEFAULT '')",
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
    "tasks": (
        "tool_calls INTEGER NOT NULL DEFAULT 0",
        "on_behalf_of TEXT NOT NULL DEFAULT ''",
        "user_issuer TEXT NOT NULL DEFAULT ''",
    ),
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


class SqlitePlanTaskStore(PlanTaskStore):
    """``PlanTaskStore`` in one SQLite file; safe to share between threads.

    Raises:
        AuditUnavailable: the file cannot be opened or brought up to date.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(SQLITE, TABLES)
        self._lock = threading.Lock()
        try:
            self._db = connect_private(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            for statement in SCHEMA:
                self._db.execute(statement)
            add_missing_columns(self._db)
        except sqlite3.Error as err:
            raise AuditUnavailable(f"task store {path}: {err}") from err

    def _transaction(self, work: Callable[[SqlConnection], _T], *, writes: bool = True) -> _T:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE" if writes else "BEGIN")
            try:
                answer = work(self._db)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return answer

    def close(self) -> None:
        with self._lock:
            self._db.close()
