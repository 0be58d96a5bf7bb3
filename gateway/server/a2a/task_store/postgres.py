"""The A2A tasks of an agent id in PostgreSQL, shared by every replica of it.

The same tasks, answers and batching as :mod:`gateway.server.a2a.task_store.store`
(one row per finished task, written by a background writer in batches; every
read waits for this process's queue first and names the owner, so a task of
another peer is the same empty answer as an id that never existed), in the
shared ``a2a_tasks`` table keyed by (agent id, task id). A task answered by
one replica is visible on the others once its batch commits (milliseconds
after the answer). ``seq`` (an identity column) breaks ties of the last-update order as
SQLite's row sequence does. If the database cannot be
read, reads raise ``StateUnavailable``; a batch that cannot be written is
logged by its size (the calls were answered already). Background and streamed
tasks (``save``, leases, orphans, retention) use the same statements as SQLite,
keyed by agent id as well. Nothing of a task's output or message is logged.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from gateway.errors import StateUnavailable
from gateway.postgres.pool import Connection, StatePool
from gateway.server.a2a.task_store.store import A2ATask, A2ATaskStore
from gateway.sql.dialect import POSTGRES

_log = logging.getLogger(__name__)


class PostgresA2ATaskStore(A2ATaskStore):
    """An :class:`~gateway.server.a2a.task_store.store.A2ATaskStore` whose rows live in the
    shared ``a2a_tasks`` table.

    Args:
        pool: The state database (the factory's pool, "A2A task store").
        agent_id: The agent id whose tasks these are (replicas share it).
    """

    def __init__(self, pool: StatePool, agent_id: str) -> None:
        super().__init__(POSTGRES, (agent_id,))  # every statement; the pool runs them
        self._pool = pool

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._pool.run, partial(self._insert_rows, batch=batch))
            except StateUnavailable as err:  # answered already: the log is all that is left
                _log.error("A2A task store: %d tasks not stored: %s", len(batch), err.message)

    def _insert_rows(self, conn: Connection, *, batch: list[A2ATask]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(self._insert, self._rows(batch))

    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        def work(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(sql, params).fetchall()

        return await asyncio.to_thread(self._pool.run, work)

    def close(self) -> None:
        """Close the pool (``flush`` first: queued tasks are not written here)."""
        self._pool.close()
