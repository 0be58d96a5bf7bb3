"""Idempotency keys in a SQLite file (``idempotency.sqlite``), one agent or its workers."""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from gateway.errors import IdempotencyConflict, IdempotencyInDoubt, StateUnavailable
from gateway.inbound.idempotency.store import (
    _T,
    IdempotencyStore,
    Ident,
    StoredAnswer,
    _now_ms,
    open_store_db,
)
from gateway.local.process_owner import holder_gone

_log = logging.getLogger(__name__)


class SqliteIdempotencyStore(IdempotencyStore):
    """The keys of one agent in a SQLite file (``idempotency.sqlite``).

    By default one agent process owns the file: opening it marks every
    ``claimed`` row ``in_doubt``, since no attempt of an earlier process can
    still be running. ``shared=True`` (worker processes of one agent) marks
    only the claims whose owner process is gone.
    """

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        super().__init__()
        self._path = path
        self._lock = threading.Lock()
        try:
            self._db = open_store_db(path)
            cut_off = self._mark_cut_off(shared=shared)
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {path}: {err}") from err
        if cut_off:
            _log.warning(
                "idempotency store %s: %d key(s) in doubt from an attempt cut off earlier; "
                "see the idempotency list command",
                path,
                cut_off,
            )

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _mark_cut_off(self, *, shared: bool) -> int:
        now = _now_ms()
        if not shared:
            return int(
                self._db.execute(
                    "UPDATE idempotency SET state = 'in_doubt', updated_unix_ms = ? "
                    "WHERE state = 'claimed'",
                    (now,),
                ).rowcount
            )
        owners = {
            str(row[0])
            for row in self._db.execute(
                "SELECT DISTINCT claim_owner FROM idempotency WHERE state = 'claimed'"
            )
        }
        gone = [owner for owner in owners if not owner or holder_gone(owner)]
        return sum(
            self._db.execute(
                "UPDATE idempotency SET state = 'in_doubt', updated_unix_ms = ? "
                "WHERE state = 'claimed' AND claim_owner = ?",
                (now, owner),
            ).rowcount
            for owner in gone
        )

    def _mark_in_doubt(self, ident: Ident, claim_id: str) -> None:
        try:
            with self._lock:
                self._db.execute(
                    "UPDATE idempotency SET state = 'in_doubt', updated_unix_ms = ? "
                    "WHERE peer = ? AND capability = ? AND key = ? AND state = 'claimed' "
                    "AND claim_id = ?",
                    (_now_ms(), *ident, claim_id),
                )
        except sqlite3.Error as err:  # the row stays 'claimed': still refused, never rerun
            _log.warning("idempotency store %s: cannot mark a key in doubt: %s", self._path, err)

    def _purge_rows(self, cutoff_ms: int) -> int:
        with self._lock:
            return int(
                self._db.execute(
                    "DELETE FROM idempotency WHERE state = 'done' AND updated_unix_ms < ?",
                    (cutoff_ms,),
                ).rowcount
            )

    async def _run(self, operation: Callable[..., _T], *args: object) -> _T:
        try:
            return await asyncio.to_thread(operation, *args)
        except StateUnavailable:
            raise
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {self._path}: {err}") from err

    def _claim_row(
        self, ident: Ident, request_sha256: str, served_version: str
    ) -> StoredAnswer | None:
        with self._lock:
            # Insert first: of two processes claiming one key at once exactly
            # one inserts; the other reads the row as a retry would.
            claim_id = secrets.token_hex(8)
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO idempotency (peer, capability, key, request_sha256, "
                "state, served_version, claim_id, claim_owner, updated_unix_ms) "
                "VALUES (?, ?, ?, ?, 'claimed', ?, ?, ?, ?)",
                (*ident, request_sha256, served_version, claim_id, self._owner, _now_ms()),
            ).rowcount
            if inserted:
                self._claims[ident] = claim_id
                return None
            row = self._db.execute(
                "SELECT request_sha256, state, served_version, payload, evidence_sha256 "
                "FROM idempotency WHERE peer = ? AND capability = ? AND key = ?",
                ident,
            ).fetchone()
        if row is None:  # deleted between the two statements (a released claim): retry
            return self._claim_row(ident, request_sha256, served_version)
        if row[1] != "done":
            if row[0] != request_sha256:
                raise IdempotencyConflict("idempotency key already used with a different payload")
            raise IdempotencyInDoubt(
                "an earlier attempt with this key was cut off; its effect is unknown"
            )
        return StoredAnswer(row[0], row[2], bytes(row[3]), row[4])

    def _complete_row(self, ident: Ident, answer: StoredAnswer) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE idempotency SET state = 'done', served_version = ?, payload = ?, "
                "evidence_sha256 = ?, updated_unix_ms = ? "
                "WHERE peer = ? AND capability = ? AND key = ?",
                (answer.served_version, answer.payload, answer.evidence_sha256, _now_ms(), *ident),
            )

    def _delete_claim(self, ident: Ident) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM idempotency WHERE peer = ? AND capability = ? AND key = ? "
                "AND state = 'claimed'",
                ident,
            )
