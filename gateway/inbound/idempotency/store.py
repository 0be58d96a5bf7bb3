"""Durable idempotency records: a repeated key gets the first answer, not a second write.

A key is *claimed* durably before the capability runs and *completed* with its
answer afterwards. A claim left behind by a crash, a timeout or a failure means
the write may or may not have happened: a retry is refused with
``IDEMPOTENCY_IN_DOUBT`` instead of running the write a second time. Storage
failures refuse the call before the side effect (``STATE_UNAVAILABLE``).

Row states: ``claimed`` (an attempt is running), ``in_doubt`` (an attempt was
cut off: marked when it ends without an answer, and at open for every claim a
previous process left behind), ``done`` (answer stored). Each claim names its
owner process (``host:pid:nonce``): worker processes sharing the file
(``workers > 1``) open it ``shared``, and then only the claims of owners that
are gone are marked in doubt, never a sibling's attempt in flight.
Only ``in_doubt`` rows may be changed by an operator
(:mod:`gateway.admin.idempotency.sqlite`); ``done`` rows are purged after the
configured retention, ``in_doubt`` rows never are.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from gateway.errors import IdempotencyConflict
from gateway.local.private_files import connect_private
from gateway.local.process_owner import new_owner_id

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
Ident = tuple[str, str, str]
"""(calling peer, capability, idempotency key): keys never cross peers."""

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


def _now_ms() -> int:
    return int(time.time() * 1000)


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


class IdempotencyStore(ABC):
    """Idempotency keys by (peer, capability, key); concurrent duplicates wait for the first.

    The interface of every backend, and the in-process coordination they share
    (a duplicate call in this process waits for the first one's answer instead
    of reading the row). Implementations store the rows
    (:class:`SqliteIdempotencyStore`,
    :class:`~gateway.inbound.idempotency.postgres.PostgresIdempotencyStore`) and keep
    these invariants:

    - A claim is durable before ``claim`` returns None, and exactly one of two
      concurrent claims of one key (in any process) wins; the other reads the
      row as a retry would.
    - A key claimed by a run that ended without an answer is ``in_doubt`` (or
      still ``claimed``, which is refused the same way): never run twice.
    - Only ``done`` rows are purged; a storage failure raises
      :class:`~gateway.errors.StateUnavailable` before any side effect.
    """

    def __init__(self) -> None:
        self._owner = new_owner_id()
        self._in_flight: dict[Ident, asyncio.Future[StoredAnswer | None]] = {}
        self._claims: dict[Ident, str] = {}

    async def claim(
        self, ident: Ident, request_sha256: str, served_version: str = ""
    ) -> StoredAnswer | None:
        """The stored answer for ``ident``, or a durable claim to run it now.

        Returns None when the caller holds the claim and must run the
        capability, then call ``complete`` or ``leave_in_doubt``.
        ``served_version`` is kept with the claim, so an operator resolving
        the key later stores the answer under the version that ran.

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
        work = asyncio.ensure_future(
            self._run(self._claim_row, ident, request_sha256, served_version)
        )
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
        The row is marked ``in_doubt`` in the background (an operator may then
        resolve it); if that write fails it stays ``claimed`` until the next
        start marks it, which is just as safe.
        """
        claim_id = self._claims.get(ident, "")
        self._release(ident, None)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._mark_in_doubt(ident, claim_id)
            return
        loop.run_in_executor(None, self._mark_in_doubt, ident, claim_id)

    async def purge_completed(self, older_than: timedelta) -> int:
        """Delete ``done`` keys last changed more than ``older_than`` ago; returns how many.

        Keys in doubt are never purged: they stay until an operator resolves them.

        Raises:
            StateUnavailable: the store cannot be written.
        """
        cutoff = _now_ms() - int(older_than.total_seconds() * 1000)
        return await self._run(self._purge_rows, cutoff)

    @abstractmethod
    def close(self) -> None:
        """Close the store."""

    async def _run(self, operation: Callable[..., _T], *args: object) -> _T:
        return await asyncio.to_thread(operation, *args)

    @abstractmethod
    def _claim_row(
        self, ident: Ident, request_sha256: str, served_version: str
    ) -> StoredAnswer | None:
        """Insert a claim (None) or return the stored answer; raise if in doubt or conflicting."""

    @abstractmethod
    def _complete_row(self, ident: Ident, answer: StoredAnswer) -> None:
        """Store the answer of a claimed key."""

    @abstractmethod
    def _delete_claim(self, ident: Ident) -> None:
        """Delete a key still ``claimed``."""

    @abstractmethod
    def _mark_in_doubt(self, ident: Ident, claim_id: str) -> None:
        """Mark ``claim_id``'s claim in doubt; log (never raise) when that fails."""

    @abstractmethod
    def _purge_rows(self, cutoff_ms: int) -> int:
        """Delete ``done`` rows last changed before ``cutoff_ms``; returns how many."""

    def _release(self, ident: Ident, answer: StoredAnswer | None) -> None:
        self._claims.pop(ident, None)
        pending = self._in_flight.pop(ident, None)
        if pending is not None and not pending.done():
            pending.set_result(answer)


def _matching(answer: StoredAnswer, request_sha256: str) -> StoredAnswer:
    if answer.request_sha256 != request_sha256:
        raise IdempotencyConflict("idempotency key already used with a different payload")
    return answer
