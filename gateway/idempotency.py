"""Durable idempotency records: a repeated key gets the first answer, not a second write."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import AuditUnavailable, IdempotencyConflict


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """The answer first given for an idempotency key.

    Attributes:
        request_sha256: Digest of the payload that produced it.
        served_version: Version that served it.
        payload: Output JSON bytes.
        evidence_sha256: Digest of the output.
    """

    request_sha256: str
    served_version: str
    payload: bytes
    evidence_sha256: str


class IdempotencyStore:
    """SQLite table keyed by (peer, capability, key); concurrent duplicates wait for the first.

    Keys are scoped to the calling peer so one peer can never read another's answers.
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS idempotency (peer TEXT NOT NULL, "
                "capability TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL, "
                "served_version TEXT NOT NULL, "
                "payload BLOB NOT NULL, evidence_sha256 TEXT NOT NULL, "
                "PRIMARY KEY (peer, capability, key))"
            )
        except sqlite3.Error as err:
            raise AuditUnavailable(f"idempotency store {path}: {err}") from err
        self._in_flight: dict[tuple[str, str, str], asyncio.Future[StoredAnswer | None]] = {}

    def _get(self, ident: tuple[str, str, str]) -> StoredAnswer | None:
        with self._lock:
            row = self._db.execute(
                "SELECT request_sha256, served_version, payload, evidence_sha256 FROM idempotency "
                "WHERE peer = ? AND capability = ? AND key = ?",
                ident,
            ).fetchone()
        return None if row is None else StoredAnswer(row[0], row[1], bytes(row[2]), row[3])

    def _put(self, ident: tuple[str, str, str], answer: StoredAnswer) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    *ident,
                    answer.request_sha256,
                    answer.served_version,
                    answer.payload,
                    answer.evidence_sha256,
                ),
            )

    async def lookup(self, ident: tuple[str, str, str], request_sha256: str) -> StoredAnswer | None:
        """The stored answer for ``ident``, waiting for an in-flight first call.

        Returns None when the caller should run the capability (and then call
        ``complete`` or ``abandon``).

        Raises:
            IdempotencyConflict: the key was used with a different payload.
        """
        while (pending := self._in_flight.get(ident)) is not None:
            answer = await asyncio.shield(pending)
            if answer is not None:
                return _matching(answer, request_sha256)
        stored = await asyncio.to_thread(self._get, ident)
        if stored is not None:
            return _matching(stored, request_sha256)
        if ident in self._in_flight:  # another call claimed the key while we read
            return await self.lookup(ident, request_sha256)
        self._in_flight[ident] = asyncio.get_running_loop().create_future()
        return None

    async def complete(self, ident: tuple[str, str, str], answer: StoredAnswer) -> None:
        """Persist the first answer for ``ident`` and release waiters."""
        try:
            await asyncio.to_thread(self._put, ident, answer)
        finally:
            self._release(ident, answer)

    def abandon(self, ident: tuple[str, str, str]) -> None:
        """The first call failed: let a waiter (or a retry) run it again."""
        self._release(ident, None)

    def _release(self, ident: tuple[str, str, str], answer: StoredAnswer | None) -> None:
        pending = self._in_flight.pop(ident, None)
        if pending is not None and not pending.done():
            pending.set_result(answer)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


def _matching(answer: StoredAnswer, request_sha256: str) -> StoredAnswer:
    if answer.request_sha256 != request_sha256:
        raise IdempotencyConflict("idempotency key already used with a different payload")
    return answer
