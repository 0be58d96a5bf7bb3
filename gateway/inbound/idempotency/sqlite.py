"""Idempotency keys in a SQLite file (``idempotency.sqlite``): one agent, or its workers.

The statements are the shared ones (:mod:`~gateway.inbound.idempotency.store`,
:mod:`~gateway.inbound.idempotency.operator`); this module holds the file: its
schema (created, or upgraded from an older release, when it is opened), the
serving store's one connection and its lock, and the operator's connection
per action (``BEGIN IMMEDIATE``: the file's write lock, while an agent may
hold it open). Each statement of the serving store commits on its own (WAL,
``synchronous=FULL``), so a claim is durable before the capability runs.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from gateway.errors import ConfigError, StateUnavailable
from gateway.inbound.idempotency.operator import AuditTarget, KeyAdmin
from gateway.inbound.idempotency.store import IdempotencyStore, _now_ms
from gateway.local.private_files import connect_private
from gateway.local.process_owner import holder_gone
from gateway.sql.dialect import SQLITE, SqlConnection

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS idempotency (peer TEXT NOT NULL, capability TEXT NOT NULL, "
    "key TEXT NOT NULL, request_sha256 TEXT NOT NULL, state TEXT NOT NULL, "
    "served_version TEXT NOT NULL DEFAULT '', payload BLOB, evidence_sha256 TEXT NOT NULL "
    "DEFAULT '', claim_id TEXT NOT NULL DEFAULT '', updated_unix_ms INTEGER NOT NULL DEFAULT 0, "
    "claim_owner TEXT NOT NULL DEFAULT '', PRIMARY KEY (peer, capability, key))"
)
# Columns added after the first release, with the ALTER that adds each to an old file.
_ADDED_COLUMNS = {
    "claim_id": "ALTER TABLE idempotency ADD COLUMN claim_id TEXT NOT NULL DEFAULT ''",
    "updated_unix_ms": (
        "ALTER TABLE idempotency ADD COLUMN updated_unix_ms INTEGER NOT NULL DEFAULT 0"
    ),
    "claim_owner": "ALTER TABLE idempotency ADD COLUMN claim_owner TEXT NOT NULL DEFAULT ''",
}


def open_store_db(path: Path, *, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection to the idempotency SQLite file, schema created or upgraded.

    Rows of an old file get ``updated_unix_ms`` = now, so retention counts from
    the upgrade rather than purging them at once.

    Raises:
        sqlite3.Error: the file cannot be opened or upgraded.
    """
    db = connect_private(path, check_same_thread=False, isolation_level=None, timeout=timeout)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("BEGIN IMMEDIATE")
        db.execute(_SCHEMA)
        present = {row[1] for row in db.execute("PRAGMA table_info(idempotency)")}
        for name, alter in _ADDED_COLUMNS.items():
            if name not in present:
                db.execute(alter)
        db.execute(
            "UPDATE idempotency SET updated_unix_ms = ? WHERE updated_unix_ms = 0", (_now_ms(),)
        )
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()
        raise
    return db


class SqliteIdempotencyStore(IdempotencyStore):
    """The keys of one agent in a SQLite file (``idempotency.sqlite``).

    By default one agent process owns the file: opening it marks every
    ``claimed`` row ``in_doubt``, since no attempt of an earlier process can
    still be running. ``shared=True`` (worker processes of one agent) marks
    only the claims whose owner process is gone (or that name no owner: rows
    of a release before owners were recorded).

    Raises:
        StateUnavailable: the file cannot be opened, upgraded or written.
    """

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        super().__init__(SQLITE)
        self._path = path
        self._lock = threading.Lock()
        try:
            self._db = open_store_db(path)
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {path}: {err}") from err
        try:
            cut_off = self._mark_cut_off(_worker_gone if shared else _anyone)
        except StateUnavailable:
            self._db.close()
            raise
        if cut_off:
            _log.warning(
                "idempotency store %s: %d key(s) in doubt from an attempt cut off earlier; "
                "see the idempotency list command",
                path,
                cut_off,
            )

    def _session(self, work: Callable[[SqlConnection], _T]) -> _T:
        try:
            with self._lock:
                return work(self._db)
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {self._path}: {err}") from err

    def _execute(self, sql: str, params: tuple[object, ...]) -> int:
        try:
            with self._lock:
                return self._db.execute(sql, params).rowcount
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {self._path}: {err}") from err

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


class SqliteKeyAdmin(KeyAdmin):
    """:class:`~gateway.inbound.idempotency.operator.KeyAdmin` of an agent's
    ``idempotency.sqlite``, opened (and upgraded) per action, never created."""

    def __init__(self, store: Path, audit_db: AuditTarget, agent_id: str) -> None:
        """Keys in ``store``; actions audited to ``audit_db`` (``agent_id``'s chain)."""
        super().__init__(SQLITE, (), audit_db, agent_id)
        self._path = store

    @property
    def where(self) -> str:
        return str(self._path)

    @contextmanager
    def _connection(self, *, write: bool) -> Iterator[SqlConnection]:
        if not self._path.is_file():
            raise ConfigError(f"idempotency store {self._path}: no such file")
        try:
            db = open_store_db(self._path)
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {self._path}: {err}") from err
        try:
            if write:
                db.execute("BEGIN IMMEDIATE")
            yield db
            if db.in_transaction:
                db.execute("COMMIT")
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {self._path}: {err}") from err
        finally:
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.close()


def _anyone(owner: str) -> bool:
    """Every claim is cut off: no process but this one uses the file."""
    return True


def _worker_gone(owner: str) -> bool:
    """A claim is cut off if its worker process is gone (or it names none)."""
    return not owner or holder_gone(owner)
