"""A claim that loses its INSERT to a row released before it reads it claims again.

Replica A holds key k and releases it (its call never started: deadline) just
after replica B's ``INSERT ... ON CONFLICT DO NOTHING`` met A's row and just
before B reads that row. B must not take the empty read as a claim won: it
would run the write with no row in the table, and a third duplicate would
then claim the free key and run the write a second time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from gateway.errors import IdempotencyInDoubt
from gateway.inbound.idempotency.postgres import PostgresIdempotencyStore
from gateway.postgres.pool import StatePool
from tests.helpers.postgres import state_pool

AGENT = "spiffe://example.org/agent/alice"
IDENT = ("spiffe://example.org/agent/bob", "notes.write", "k1")


class _ReleasedMidClaim:
    """Wraps a connection: right after the claim's INSERT meets a row, another
    session deletes that row (a release committing between the two statements)."""

    def __init__(self, conn: Any, dsn: str) -> None:
        self._conn, self._dsn, self.fired = conn, dsn, False

    def execute(self, sql: str, params: Any = None) -> Any:
        cursor = self._conn.execute(sql, params)
        if sql.startswith("INSERT INTO idempotency") and not self.fired:
            self.fired = True
            with psycopg.connect(self._dsn, autocommit=True) as other:
                other.execute("DELETE FROM idempotency WHERE state = 'claimed'")
        return cursor


class _RacingPool:
    def __init__(self, pool: StatePool, dsn: str) -> None:
        self._pool, self._dsn = pool, dsn
        self.wrapper: _ReleasedMidClaim | None = None

    def run(self, work: Callable[[Any], Any]) -> Any:
        def wrapped(conn: Any) -> Any:
            if self.wrapper is None:
                self.wrapper = _ReleasedMidClaim(conn, self._dsn)
            self.wrapper._conn = conn
            return work(self.wrapper)

        return self._pool.run(wrapped)

    def close(self) -> None:
        self._pool.close()


async def test_a_claim_whose_row_was_released_meanwhile_is_durable_and_single(
    pg_dsn: str,
) -> None:
    first = PostgresIdempotencyStore(state_pool(pg_dsn, "idempotency store"), AGENT)
    racing = _RacingPool(state_pool(pg_dsn, "idempotency store"), pg_dsn)
    second = PostgresIdempotencyStore(racing, AGENT)  # type: ignore[arg-type]
    third = PostgresIdempotencyStore(state_pool(pg_dsn, "idempotency store"), AGENT)
    try:
        assert await first.claim(IDENT, "sha") is None  # replica A holds the key
        assert await second.claim(IDENT, "sha") is None  # B runs the write...
        assert racing.wrapper is not None and racing.wrapper.fired
        with psycopg.connect(pg_dsn) as conn:  # ...holding a durable claim
            rows = conn.execute(
                "SELECT state, claim_owner FROM idempotency WHERE agent_id = %s AND key = %s",
                (AGENT, IDENT[2]),
            ).fetchall()
        assert rows == [("claimed", second._owner)]
        # A third duplicate must not run the write again.
        with pytest.raises(IdempotencyInDoubt):
            await third.claim(IDENT, "sha")
    finally:
        for store in (first, second, third):
            store.close()
