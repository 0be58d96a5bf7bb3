"""Durable idempotency records: a repeated key gets the first answer, not a second write.

A key is *claimed* durably before the capability runs and *completed* with its
answer afterwards. A claim left behind by a crash, a timeout or a failure means
the write may or may not have happened: a retry is refused with
``IDEMPOTENCY_IN_DOUBT`` instead of running the write a second time. Storage
failures refuse the call before the side effect (``STATE_UNAVAILABLE``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gateway.errors import IdempotencyConflict, IdempotencyInDoubt, StateUnavailable

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
Ident = tuple[str, str, str]
"""(calling peer, capability, idempotency key): keys never cross peers."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS idempotency (peer TEXT NOT NULL, capability TEXT NOT NULL, "
    "key TEXT NOT NULL, request_sha256 TEXT NOT NULL, state TEXT NOT NULL, "
    "served_version TEXT NOT NULL DEFAULT '', payload BLOB, evidence_sha256 TEXT NOT NULL "
    "DEFAULT '', PRIMARY KEY (peer, capability, key))"
)


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
    """SQLite table keyed by (peer, capability, key); concurrent duplicates wait for the first."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {path}: {err}") from err
        self._in_flight: dict[Ident, asyncio.Future[StoredAnswer | None]] = {}

    async def claim(self, ident: Ident, request_sha256: str) -> StoredAnswer | None:
        """The stored answer for ``ident``, or a durable claim to run it now.

        Returns None when the caller holds the claim and must run the
        capability, then call ``complete`` or ``leave_in_doubt``.

        Raises:
            IdempotencyConflict: the key was used with a different payload.
            IdempotencyInDoubt: an earlier attempt was cut off mid-run.
            StateUnavailable: the store cannot be read or written.
        """
        while (pending := self._in_flight.get(ident)) is not None:
            answer = await asyncio.shield(pending)
            if answer is not None:
                return _matching(answer, request_sha256)
        self._in_flight[ident] = asyncio.get_running_loop().create_future()
        # The row is written in a thread that a cancellation cannot stop: shield
        # it, so a call cancelled mid-claim can still see what it wrote.
        work = asyncio.ensure_future(self._run(self._claim_row, ident, request_sha256))
        try:
            stored = await asyncio.shield(work)
        except asyncio.CancelledError:
            await self._abandon_claim(work, ident)
            raise
        except BaseException:
            self._release(ident, None)
            raise
        if stored is not None:
            self._release(ident, stored)
            return _matching(stored, request_sha256)
        return None

    async def complete(self, ident: Ident, answer: StoredAnswer) -> None:
        """Store the answer for a claimed key and release waiters."""
        try:
            await self._run(self._complete_row, ident, answer)
        finally:
            self._release(ident, answer)

    async def release(self, ident: Ident) -> None:
        """The claimed run never started: drop the claim so a retry may run it."""
        try:
            await self._run(self._delete_claim, ident)
        finally:
            self._release(ident, None)

    async def _abandon_claim(self, work: asyncio.Future[StoredAnswer | None], ident: Ident) -> None:
        """The caller was cancelled before its claim returned: nothing ran, so
        a claim the thread still wrote is dropped rather than left in doubt."""
        _log.info("call cancelled while claiming its idempotency key; the key stays free")
        try:
            claimed = await work is None
        except Exception:
            claimed = False  # conflict, in doubt or storage failure: no claim was made
        if claimed:
            await self.release(ident)
        else:
            self._release(ident, None)

    def leave_in_doubt(self, ident: Ident) -> None:
        """The claimed run started but did not finish with an answer.

        Its side effect may have happened (a cancelled or timed-out function can
        still have written), so the claim stays: retries get IDEMPOTENCY_IN_DOUBT.
        """
        self._release(ident, None)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    async def _run(self, operation: Callable[..., _T], *args: object) -> _T:
        try:
            return await asyncio.to_thread(operation, *args)
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {self._path}: {err}") from err

    def _claim_row(self, ident: Ident, request_sha256: str) -> StoredAnswer | None:
        with self._lock:
            row = self._db.execute(
                "SELECT request_sha256, state, served_version, payload, evidence_sha256 "
                "FROM idempotency WHERE peer = ? AND capability = ? AND key = ?",
                ident,
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO idempotency (peer, capability, key, request_sha256, state) "
                    "VALUES (?, ?, ?, ?, 'claimed')",
                    (*ident, request_sha256),
                )
                return None
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
                "evidence_sha256 = ? WHERE peer = ? AND capability = ? AND key = ?",
                (answer.served_version, answer.payload, answer.evidence_sha256, *ident),
            )

    def _delete_claim(self, ident: Ident) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM idempotency WHERE peer = ? AND capability = ? AND key = ? "
                "AND state = 'claimed'",
                ident,
            )

    def _release(self, ident: Ident, answer: StoredAnswer | None) -> None:
        pending = self._in_flight.pop(ident, None)
        if pending is not None and not pending.done():
            pending.set_result(answer)


def _matching(answer: StoredAnswer, request_sha256: str) -> StoredAnswer:
    if answer.request_sha256 != request_sha256:
        raise IdempotencyConflict("idempotency key already used with a different payload")
    return answer
