"""Idempotency keys in PostgreSQL, shared by every replica of one agent id.

The same statements, states and answers as the SQLite store (see
:mod:`gateway.inbound.idempotency.store`), keyed by agent id, each operation
one transaction. A claim is ``INSERT ... ON CONFLICT DO NOTHING`` there too:
of two replicas getting the same key at once exactly one inserts the row and
runs the write; the other reads the row and answers as a retry would (in
doubt, or the answer). What a fleet needs besides:

* Opening the store marks no claim in doubt (other replicas' attempts may be
  running): claims are cut off, before each purge, only when their owner
  process is gone (:func:`gateway.local.process_owner.holder_gone`) or they
  are older than ``STALE_CLAIM``. Either way a retry of such a key gets
  ``IDEMPOTENCY_IN_DOUBT``, never a second write.
* The operator's actions lock the key's row ``FOR UPDATE``, so no replica
  claims or completes it meanwhile, and show such a cut-off claim as what it
  is (in doubt) although no start has marked it: no replica can still be
  running it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import psycopg

from gateway.errors import StateUnavailable
from gateway.inbound.idempotency.operator import AuditTarget, KeyAdmin
from gateway.inbound.idempotency.store import IdempotencyStore
from gateway.local.process_owner import holder_gone
from gateway.postgres.pool import StatePool
from gateway.postgres.source import ConnectionSource
from gateway.sql.dialect import POSTGRES, SqlConnection

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
STALE_CLAIM = timedelta(hours=1)
"""A claim older than this is marked in doubt whoever holds it (no call lasts as long)."""


def _stale_before_ms() -> int:
    return int(time.time() * 1000) - int(STALE_CLAIM.total_seconds() * 1000)


class PostgresIdempotencyStore(IdempotencyStore):
    """An :class:`~gateway.inbound.idempotency.store.IdempotencyStore` whose rows live in the
    shared ``idempotency`` table."""

    def __init__(self, pool: StatePool, agent_id: str) -> None:
        """``agent_id``'s keys, reached through ``pool`` (the factory's, "idempotency store")."""
        super().__init__(POSTGRES, (agent_id,))
        self._pool = pool

    def _session(self, work: Callable[[SqlConnection], _T]) -> _T:
        return self._pool.run(work)

    def _execute(self, sql: str, params: tuple[object, ...]) -> int:
        return self._pool.run(lambda conn: conn.execute(sql, params).rowcount)

    def mark_cut_off_claims(self) -> int:
        """Mark in doubt the claims of processes that are gone (or stale); returns how many."""
        cut_off = self._mark_cut_off(holder_gone, _stale_before_ms())
        if cut_off:
            _log.warning("idempotency store: %d key(s) in doubt from attempts cut off", cut_off)
        return cut_off

    async def purge_completed(self, older_than: timedelta) -> int:
        await self._run(self.mark_cut_off_claims)
        return await super().purge_completed(older_than)

    def close(self) -> None:
        self._pool.close()


class PostgresKeyAdmin(KeyAdmin):
    """:class:`~gateway.inbound.idempotency.operator.KeyAdmin` of the keys every
    replica of an agent shares in PostgreSQL (its own connection per action)."""

    def __init__(self, source: ConnectionSource, audit_db: AuditTarget, agent_id: str) -> None:
        """``agent_id``'s keys in ``source``'s database; actions audited to ``audit_db``."""
        super().__init__(POSTGRES, (agent_id,), audit_db, agent_id)
        self._source = source

    @property
    def where(self) -> str:
        return str(self._source)

    @contextmanager
    def _connection(self, *, write: bool) -> Iterator[SqlConnection]:
        try:
            conn = self._source.connect(timeout=10)
        except psycopg.Error as err:
            raise self._unavailable(err) from err
        with conn:
            try:
                with conn.transaction():
                    yield conn
            except psycopg.Error as err:
                raise self._unavailable(err) from err

    def _unavailable(self, err: psycopg.Error) -> StateUnavailable:
        return StateUnavailable(f"idempotency store {self._source}: {self._source.why(err)}")

    def _seen(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A claim whose owner is gone, or that is stale, is shown in doubt."""
        if row[3] == "claimed" and (holder_gone(str(row[8])) or int(row[7]) < _stale_before_ms()):
            return (*row[:3], "in_doubt", *row[4:])
        return row
