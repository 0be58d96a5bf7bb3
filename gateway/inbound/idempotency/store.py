"""Durable idempotency records: a repeated key gets the first answer, not a second write.

A key is *claimed* durably before the capability runs and *completed* with its
answer afterwards. A claim left behind by a crash, a timeout or a failure means
the write may or may not have happened: a retry is refused with
``IDEMPOTENCY_IN_DOUBT`` instead of running the write a second time. Storage
failures refuse the call before the side effect (``STATE_UNAVAILABLE``).

Row states: ``claimed`` (an attempt is running), ``in_doubt`` (an attempt was
cut off: marked when it ends without an answer, and for the claims a process
that is gone left behind), ``done`` (answer stored). Each claim names its
owner process (``host:pid:nonce``), so a backend shared by processes marks
only the claims of owners that are gone, never a sibling's attempt in flight.
Only ``in_doubt`` rows may be changed by an operator
(:mod:`gateway.inbound.idempotency.operator`); ``done`` rows are purged after the
configured retention, ``in_doubt`` rows never are.

:class:`IdempotencyStore` holds the statements (written once over a
:class:`~gateway.sql.dialect.Dialect`) and the in-process coordination; its
backends, :mod:`~gateway.inbound.idempotency.sqlite` (one agent's file) and
:mod:`~gateway.inbound.idempotency.postgres` (the table every replica shares),
give it a connection and say whose claims are cut off.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any, TypeVar

from gateway.errors import IdempotencyConflict, IdempotencyInDoubt
from gateway.local.process_owner import new_owner_id
from gateway.sql.dialect import Dialect, SqlConnection

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
Ident = tuple[str, str, str]
"""(calling peer, capability, idempotency key): keys never cross peers."""


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


@dataclass(frozen=True, slots=True)
class KeyStatements:
    """The statements on the ``idempotency`` table, in one dialect (see :func:`statements`)."""

    claim: str
    read: str
    complete: str
    drop_claim: str
    in_doubt: str
    purge: str
    claim_owners: str
    cut_owner: str
    cut_stale: str


@cache
def statements(sql: Dialect) -> KeyStatements:
    """Every statement the serving side runs, built once per dialect."""
    key = sql.where("peer", "capability", "key")
    claimed = sql.where(also="state = 'claimed'")
    to_doubt = f"UPDATE idempotency SET state = 'in_doubt', updated_unix_ms = {sql.mark} WHERE "
    return KeyStatements(
        claim=(
            "INSERT INTO idempotency ("
            + sql.columns(
                "peer, capability, key, request_sha256, state, served_version, claim_id, "
                "claim_owner, updated_unix_ms"
            )
            + f") VALUES ({sql.marks(len(sql.scope) + 4)}, 'claimed', {sql.marks(4)}) "
            "ON CONFLICT DO NOTHING"
        ),
        read=(
            "SELECT request_sha256, state, served_version, payload, evidence_sha256 "
            f"FROM idempotency WHERE {key}"
        ),
        complete=(
            f"UPDATE idempotency SET state = 'done', served_version = {sql.mark}, "
            f"payload = {sql.mark}, evidence_sha256 = {sql.mark}, updated_unix_ms = {sql.mark} "
            f"WHERE {key}"
        ),
        drop_claim=f"DELETE FROM idempotency WHERE {key} AND state = 'claimed'",
        in_doubt=f"{to_doubt}{key} AND state = 'claimed' AND claim_id = {sql.mark}",
        purge=(
            "DELETE FROM idempotency WHERE "
            + sql.where(also=f"state = 'done' AND updated_unix_ms < {sql.mark}")
        ),
        claim_owners=f"SELECT DISTINCT claim_owner FROM idempotency WHERE {claimed}",
        cut_owner=f"{to_doubt}{claimed} AND claim_owner = {sql.mark}",
        cut_stale=f"{to_doubt}{claimed} AND updated_unix_ms < {sql.mark}",
    )


class IdempotencyStore(ABC):
    """Idempotency keys by (peer, capability, key); concurrent duplicates wait for the first.

    The interface of every backend, the statements they share and the
    in-process coordination (a duplicate call in this process waits for the
    first one's answer instead of reading the row). Backends
    (:class:`~gateway.inbound.idempotency.sqlite.SqliteIdempotencyStore`,
    :class:`~gateway.inbound.idempotency.postgres.PostgresIdempotencyStore`)
    give it a connection (:meth:`_session`); every implementation keeps these
    invariants:

    - A claim is durable before ``claim`` returns None, and exactly one of two
      concurrent claims of one key (in any process) wins; the other reads the
      row as a retry would.
    - A key claimed by a run that ended without an answer is ``in_doubt`` (or
      still ``claimed``, which is refused the same way): never run twice.
    - Only ``done`` rows are purged; a storage failure raises
      :class:`~gateway.errors.StateUnavailable` before any side effect.

    Args:
        sql: The backend's dialect.
        scope: The values of ``sql.scope`` (the agent id in a shared table).
    """

    def __init__(self, sql: Dialect, scope: tuple[str, ...] = ()) -> None:
        self._sql = statements(sql)
        self._scope = scope
        self._owner = new_owner_id()
        self._in_flight: dict[Ident, asyncio.Future[StoredAnswer | None]] = {}
        self._claims: dict[Ident, str] = {}

    @abstractmethod
    def _session(self, work: Callable[[SqlConnection], _T]) -> _T:
        """``work`` on the backend's connection, in this thread; each statement is
        atomic on its own, and PostgreSQL runs the whole of ``work`` as one transaction.

        Raises:
            StateUnavailable: the store cannot be read or written.
        """

    @abstractmethod
    def _execute(self, sql: str, params: tuple[object, ...]) -> int:
        """One statement, as :meth:`_session` runs it; how many rows it changed."""

    @abstractmethod
    def close(self) -> None:
        """Close the store."""

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

    async def _run(self, operation: Callable[..., _T], *args: object) -> _T:
        return await asyncio.to_thread(operation, *args)

    def _claim_row(
        self, ident: Ident, request_sha256: str, served_version: str
    ) -> StoredAnswer | None:
        """Insert a claim (None) or return the stored answer; raise if in doubt or conflicting."""
        claim_id = secrets.token_hex(8)
        key = self._scope + ident
        claim = (*key, request_sha256, served_version, claim_id, self._owner, _now_ms())

        def insert(conn: SqlConnection) -> tuple[Any, ...] | None:
            # Insert first: of two processes claiming one key at once exactly
            # one inserts; the other reads the row as a retry would.
            if conn.execute(self._sql.claim, claim).rowcount:
                return None
            return conn.execute(self._sql.read, key).fetchone() or ()

        row = self._session(insert)
        if row is None:
            self._claims[ident] = claim_id
            return None
        if not row:  # released between the two statements (a new snapshot each): retry
            return self._claim_row(ident, request_sha256, served_version)
        if row[1] != "done":
            if row[0] != request_sha256:
                raise IdempotencyConflict("idempotency key already used with a different payload")
            raise IdempotencyInDoubt(
                "an earlier attempt with this key was cut off; its effect is unknown"
            )
        return StoredAnswer(row[0], row[2], bytes(row[3]), row[4])

    def _complete_row(self, ident: Ident, answer: StoredAnswer) -> None:
        """Store the answer of a claimed key."""
        done = (answer.served_version, answer.payload, answer.evidence_sha256, _now_ms())
        self._execute(self._sql.complete, done + self._scope + ident)

    def _delete_claim(self, ident: Ident) -> None:
        """Delete a key still ``claimed``."""
        self._execute(self._sql.drop_claim, self._scope + ident)

    def _mark_in_doubt(self, ident: Ident, claim_id: str) -> None:
        """Mark ``claim_id``'s claim in doubt; log (never raise) when that fails."""
        marked = (_now_ms(), *self._scope, *ident, claim_id)
        try:
            self._execute(self._sql.in_doubt, marked)
        except Exception as err:  # the row stays 'claimed': still refused, never rerun
            _log.warning("idempotency store: cannot mark a key in doubt: %s", err)

    def _purge_rows(self, cutoff_ms: int) -> int:
        """Delete ``done`` rows last changed before ``cutoff_ms``; returns how many."""
        return self._execute(self._sql.purge, (*self._scope, cutoff_ms))

    def _mark_cut_off(self, gone: Callable[[str], bool], stale_before_ms: int = 0) -> int:
        """Mark in doubt the claims whose owner is ``gone``, and those last changed
        before ``stale_before_ms`` (if given), in one session; returns how many."""

        def work(conn: SqlConnection) -> int:
            now = _now_ms()
            claimed = conn.execute(self._sql.claim_owners, self._scope).fetchall()
            owners = {str(row[0]) for row in claimed}
            cut = sum(
                conn.execute(self._sql.cut_owner, (now, *self._scope, owner)).rowcount
                for owner in owners
                if gone(owner)
            )
            if stale_before_ms:
                stale = (now, *self._scope, stale_before_ms)
                cut += conn.execute(self._sql.cut_stale, stale).rowcount
            return cut

        return self._session(work)

    def _release(self, ident: Ident, answer: StoredAnswer | None) -> None:
        self._claims.pop(ident, None)
        pending = self._in_flight.pop(ident, None)
        if pending is not None and not pending.done():
            pending.set_result(answer)


def _matching(answer: StoredAnswer, request_sha256: str) -> StoredAnswer:
    if answer.request_sha256 != request_sha256:
        raise IdempotencyConflict("idempotency key already used with a different payload")
    return answer


def _now_ms() -> int:
    return int(time.time() * 1000)
