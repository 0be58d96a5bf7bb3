"""Push configs and the outbox of one agent in a SQLite file (``push.sqlite``, WAL, 0600)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.errors import StateUnavailable
from gateway.local.private_files import connect_private
from gateway.push.store.store import PushStore
from gateway.sql.dialect import SQLITE

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS push_configs (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "task_id TEXT NOT NULL, config_id TEXT NOT NULL, owner TEXT NOT NULL, url TEXT NOT NULL, "
    "token TEXT NOT NULL, auth_scheme TEXT NOT NULL, auth_credentials TEXT NOT NULL, "
    "created_ms INTEGER NOT NULL, UNIQUE (task_id, config_id))",
    "CREATE TABLE IF NOT EXISTS push_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "owner TEXT NOT NULL, task_id TEXT NOT NULL, config_id TEXT NOT NULL, "
    "notification_id TEXT NOT NULL, body BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, "
    "next_ms INTEGER NOT NULL, lease_ms INTEGER NOT NULL DEFAULT 0, created_ms INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS push_outbox_config ON push_outbox (task_id, config_id, seq)",
    "CREATE INDEX IF NOT EXISTS push_outbox_due ON push_outbox (next_ms)",
)


class SqlitePushStore(PushStore):
    """A :class:`~gateway.push.store.store.PushStore` in one SQLite file (WAL,
    ``synchronous=FULL``: a committed notification survives a power loss too).

    Raises:
        StateUnavailable: the file cannot be opened or made.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(SQLITE)
        self._lock = threading.Lock()
        try:
            self._db = connect_private(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            for statement in _SCHEMA:
                self._db.execute(statement)
        except sqlite3.Error as err:
            raise StateUnavailable(f"push store {path}: {err}") from err

    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        def work() -> list[tuple[Any, ...]]:
            with self._lock:
                return self._db.execute(sql, params).fetchall()

        try:
            return await asyncio.to_thread(work)
        except sqlite3.Error as err:
            raise StateUnavailable(f"push store: {err}") from err

    async def _insert_many(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        def work() -> None:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(sql, rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

        try:
            await asyncio.to_thread(work)
        except sqlite3.Error as err:
            raise StateUnavailable(f"push store: {err}") from err

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()
