"""Push configs and the outbox of an agent id in PostgreSQL, shared by its replicas.

The same statements as SQLite (:mod:`gateway.push.store.store`), every one
keyed by the agent id as well; the tables are made by migration 9
(:mod:`gateway.postgres.migrations`). A notification enqueued by one replica
may be delivered by another: the lease of a claimed row keeps a webhook's
notifications in order and one at a time across replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

from gateway.postgres.pool import Connection, StatePool
from gateway.push.store.store import PushStore
from gateway.sql.dialect import POSTGRES


class PostgresPushStore(PushStore):
    """A :class:`~gateway.push.store.store.PushStore` in the shared ``push_configs`` and
    ``push_outbox`` tables.

    Args:
        pool: The state database (the factory's pool, "push store").
        agent_id: The agent id whose rows these are (replicas share it).
    """

    def __init__(self, pool: StatePool, agent_id: str) -> None:
        super().__init__(POSTGRES, (agent_id,))  # every statement; the pool runs them
        self._pool = pool

    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        def work(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(sql, params).fetchall()

        return await asyncio.to_thread(self._pool.run, work)

    async def _insert_many(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        await asyncio.to_thread(self._pool.run, partial(_insert_rows, sql=sql, rows=rows))

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()


def _insert_rows(conn: Connection, *, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
    with conn.cursor() as cursor:
        cursor.executemany(sql, rows)
