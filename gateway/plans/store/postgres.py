"""Plan task checkpoints in PostgreSQL: the tasks of one agent id, shared by its replicas.

The statements are :class:`~gateway.plans.store.store.PlanTaskStore`'s, on
the ``tasks`` and ``task_*`` tables (created by :mod:`gateway.postgres.migrations`)
keyed by (agent id, task id); each operation is one transaction of the pool,
and the lease (and, for a new lease, the task row) is locked ``FOR UPDATE``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gateway.plans.store.store import PlanTaskStore, PlanTaskTables
from gateway.postgres.pool import StatePool
from gateway.sql.dialect import POSTGRES, SqlConnection

_T = TypeVar("_T")

TABLES = PlanTaskTables(
    steps="task_steps",
    revisions="task_revisions",
    write_pins="task_write_pins",
    leases="task_leases",
    approvals="task_approvals",
    failed_attempts="task_failed_attempts",
)
"""The tables of the shared database (every agent's tasks)."""


class PostgresPlanTaskStore(PlanTaskStore):
    """``PlanTaskStore`` in the shared ``tasks``/``task_*`` tables, one agent id's rows."""

    def __init__(self, pool: StatePool, agent_id: str) -> None:
        """``agent_id``'s tasks, reached through ``pool`` (the factory's, "task store")."""
        super().__init__(POSTGRES, TABLES, (agent_id,))
        self._pool = pool

    def _transaction(self, work: Callable[[SqlConnection], _T], *, writes: bool = True) -> _T:
        return self._pool.run(work)

    def close(self) -> None:
        self._pool.close()
