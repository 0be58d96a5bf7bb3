"""The A2A tasks of an agent id in PostgreSQL, shared by every replica of it.

The same tasks, answers and batching as :mod:`gateway.transport.a2a.task_store`
(one row per finished task, written by a background writer in batches; every
read waits for this process's queue first and names the owner, so a task of
another peer is the same empty answer as an id that never existed), in the
shared ``a2a_tasks`` table keyed by (agent id, task id). A task answered by
one replica is visible on the others once its batch commits (milliseconds
after the answer). ``seq`` (an identity column) orders the tasks newest first
and is the page token, as SQLite's row sequence is. If the database cannot be
read, reads raise ``StateUnavailable``; a batch that cannot be written is
logged by its size (the calls were answered already). Nothing of a task's
output or message is logged.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from gateway.errors import StateUnavailable
from gateway.postgres.dsn import PostgresDsn
from gateway.postgres.pool import Connection, StatePool
from gateway.transport.a2a.task_store import (
    A2ATask,
    A2ATaskStore,
    TaskFilter,
    TaskPage,
    page_size,
    page_token_seq,
    task_from_row,
)

_log = logging.getLogger(__name__)

_COLUMNS = (
    "task_id, owner, context_id, state, capability, served_version, output, "
    "evidence_sha256, replayed, reason, message, created_ms, updated_ms"
)
_INSERT = (
    f"INSERT INTO a2a_tasks (agent_id, {_COLUMNS}) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


class PostgresA2ATaskStore(A2ATaskStore):
    """``A2ATaskStore`` whose rows live in the shared ``a2a_tasks`` table.

    Args:
        dsn: The state database.
        agent_id: The agent id whose tasks these are (replicas share it).
    """

    def __init__(self, dsn: PostgresDsn, agent_id: str) -> None:
        # Not super().__init__: that opens the SQLite file. Inherited are put and
        # flush (the in-process queue and its writer); the rows are below.
        self._agent = agent_id
        self._pool = StatePool(dsn, "A2A task store")
        self._pending: list[A2ATask] = []
        self._writer: asyncio.Task[None] | None = None

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._pool.run, partial(self._insert_rows, batch=batch))
            except StateUnavailable as err:  # answered already: the log is all that is left
                _log.error("A2A task store: %d tasks not stored: %s", len(batch), err.message)

    def _insert_rows(self, conn: Connection, *, batch: list[A2ATask]) -> None:
        rows = [
            (
                self._agent,
                task.task_id,
                task.owner,
                task.context_id,
                task.state.value,
                task.capability,
                task.served_version,
                task.output,
                task.evidence_sha256,
                task.replayed,
                task.reason,
                task.message,
                task.created_ms,
                task.updated_ms,
            )
            for task in batch
        ]
        with conn.cursor() as cursor:
            cursor.executemany(_INSERT, rows)

    async def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        def work(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(sql, params).fetchall()

        return await asyncio.to_thread(self._pool.run, work)

    async def get(self, owner: str, task_id: str) -> A2ATask | None:
        """``owner``'s task ``task_id``; None if it has none by that id (whoever else might).

        Raises:
            StateUnavailable: the database could not be read.
        """
        await self.flush()
        rows = await self._rows(
            f"SELECT {_COLUMNS} FROM a2a_tasks WHERE agent_id = %s AND task_id = %s AND owner = %s",
            (self._agent, task_id, owner),
        )
        return task_from_row(rows[0]) if rows else None

    async def list(self, owner: str, wanted: TaskFilter) -> TaskPage:
        """A page of ``owner``'s tasks, newest first.

        Raises:
            InvalidRequest: the page token is not one this store handed out.
            StateUnavailable: the database could not be read.
        """
        await self.flush()
        where: list[str] = ["agent_id = %s", "owner = %s"]
        params: list[Any] = [self._agent, owner]
        if wanted.context_id:
            where.append("context_id = %s")
            params.append(wanted.context_id)
        if wanted.state is not None:
            where.append("state = %s")
            params.append(wanted.state.value)
        if wanted.updated_after_ms:
            where.append("updated_ms >= %s")
            params.append(wanted.updated_after_ms)
        condition = " AND ".join(where)
        page_where, page_params = condition, list(params)
        if wanted.page_token:
            page_where += " AND seq < %s"
            page_params.append(page_token_seq(wanted.page_token))
        size = page_size(wanted)
        total = await self._rows(f"SELECT COUNT(*) FROM a2a_tasks WHERE {condition}", (*params,))
        rows = await self._rows(
            f"SELECT {_COLUMNS}, seq FROM a2a_tasks WHERE {page_where} ORDER BY seq DESC LIMIT %s",
            (*page_params, size + 1),
        )
        more = len(rows) > size
        rows = rows[:size]
        token = str(rows[-1][-1]) if more and rows else ""
        return TaskPage([task_from_row(row[:-1]) for row in rows], token, int(total[0][0]))

    def close(self) -> None:
        """Close the pool (``flush`` first: queued tasks are not written here)."""
        self._pool.close()
