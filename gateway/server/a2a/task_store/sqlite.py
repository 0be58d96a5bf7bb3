"""The A2A tasks of one agent in a SQLite file (``a2a-tasks.sqlite``, WAL)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from gateway.errors import StateUnavailable
from gateway.local.private_files import connect_private
from gateway.server.a2a.task_store.store import UNFINISHED, A2ATask, A2ATaskStore
from gateway.sql.dialect import SQLITE

_log = logging.getLogger(__name__)


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS a2a_tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "task_id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, context_id TEXT NOT NULL, "
    "state TEXT NOT NULL, capability TEXT NOT NULL, served_version TEXT NOT NULL, "
    "output BLOB, evidence_sha256 TEXT NOT NULL, replayed INTEGER NOT NULL, "
    "reason TEXT NOT NULL, message TEXT NOT NULL, created_ms INTEGER NOT NULL, "
    "updated_ms INTEGER NOT NULL, runner TEXT NOT NULL DEFAULT '', "
    "lease_ms INTEGER NOT NULL DEFAULT 0, cancel_by TEXT NOT NULL DEFAULT '', "
    "status_json BLOB NOT NULL DEFAULT x'', history BLOB NOT NULL DEFAULT x'', "
    "asked_schema TEXT NOT NULL DEFAULT '', on_behalf_of TEXT NOT NULL DEFAULT '', "
    "user_issuer TEXT NOT NULL DEFAULT '')",
    "CREATE INDEX IF NOT EXISTS a2a_tasks_owner ON a2a_tasks (owner, seq)",
    "CREATE TABLE IF NOT EXISTS a2a_task_chunks (task_id TEXT NOT NULL, owner TEXT NOT NULL, "
    "n INTEGER NOT NULL, chunk BLOB NOT NULL, PRIMARY KEY (task_id, n))",
    "CREATE TABLE IF NOT EXISTS a2a_task_inputs (task_id TEXT NOT NULL, owner TEXT NOT NULL, "
    "message_id TEXT NOT NULL, state TEXT NOT NULL, input BLOB NOT NULL, parts BLOB NOT NULL, "
    "created_ms INTEGER NOT NULL, PRIMARY KEY (task_id, message_id))",
)
_UNFINISHED_INDEX = (
    "DROP INDEX IF EXISTS a2a_tasks_unfinished",  # before input-required: two states only
    "CREATE INDEX IF NOT EXISTS a2a_tasks_open ON a2a_tasks (lease_ms) "
    f"WHERE state IN {UNFINISHED!r}",
)
"""Finds orphans without a scan; finished rows (nearly all) are not in it."""
_ADDED_COLUMNS = (
    ("runner", "TEXT NOT NULL DEFAULT ''"),
    ("lease_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("cancel_by", "TEXT NOT NULL DEFAULT ''"),
    ("status_json", "BLOB NOT NULL DEFAULT x''"),
    ("history", "BLOB NOT NULL DEFAULT x''"),
    ("asked_schema", "TEXT NOT NULL DEFAULT ''"),
    ("on_behalf_of", "TEXT NOT NULL DEFAULT ''"),
    ("user_issuer", "TEXT NOT NULL DEFAULT ''"),
)
"""Columns added since the first release: background tasks, conversations, then the
user a task was started for (older files get them when opened; their rows read as
started for no user)."""


class SqliteA2ATaskStore(A2ATaskStore):
    """The A2A tasks of one agent in a SQLite file (``a2a-tasks.sqlite``, WAL)."""

    def __init__(self, path: Path) -> None:
        super().__init__(SQLITE)
        self._lock = threading.Lock()
        try:
            self._db = connect_private(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            for statement in _SCHEMA:
                self._db.execute(statement)
            present = {row[1] for row in self._db.execute("PRAGMA table_info(a2a_tasks)")}
            for name, ddl in _ADDED_COLUMNS:
                if name not in present:
                    self._db.execute(f"ALTER TABLE a2a_tasks ADD COLUMN {name} {ddl}")
            for statement in _UNFINISHED_INDEX:
                self._db.execute(statement)
        except sqlite3.Error as err:
            raise StateUnavailable(f"A2A task store {path}: {err}") from err

    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        def work() -> list[tuple[Any, ...]]:
            with self._lock:
                return self._db.execute(sql, params).fetchall()

        try:
            return await asyncio.to_thread(work)
        except sqlite3.Error as err:
            raise StateUnavailable(f"A2A task store: {err}") from err

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._insert_rows, batch)
            except sqlite3.Error as err:  # answered already: the log is all that is left
                _log.error("A2A task store: %d tasks not stored: %s", len(batch), err)

    def _insert_rows(self, batch: list[A2ATask]) -> None:
        rows = self._rows(batch)
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(self._insert, rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Release the store (``flush`` first: queued tasks are not written here)."""
        with self._lock:
            self._db.close()
