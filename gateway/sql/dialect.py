"""What differs between SQLite and PostgreSQL in the statements the stores share.

A store whose two backends run the same statements (the A2A tasks, the plan
tasks, the idempotency keys) keeps them, and the logic around them, in its
``store.py``, written once over a :class:`Dialect`; its ``sqlite.py`` and
``postgres.py`` hold only what is theirs: the connection (a file and a lock,
or a pool), the transaction, and which dialect. What never is shared is
the schema: a SQLite file creates and upgrades its tables when it is opened,
PostgreSQL's are versioned in :mod:`gateway.postgres.migrations`, and an
existing file or database must keep working as it is.

Both engines read the same upserts (``INSERT ... ON CONFLICT ... DO UPDATE`` /
``DO NOTHING``: SQLite 3.24 and later) and ``RETURNING`` (SQLite 3.35 and
later), so these need no dialect. A leaf: only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Rows(Protocol):
    """What a statement's cursor gives back (``sqlite3`` and ``psycopg`` cursors both do)."""

    @property
    def rowcount(self) -> int:
        """Rows the statement changed."""

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or None."""

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every row left."""


class SqlConnection(Protocol):
    """A connection the shared statements run on (``sqlite3`` or ``psycopg``)."""

    def execute(self, sql: str, params: Any = (), /) -> Rows:
        """Run one statement with its parameters."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """The forms one engine spells its own way, and how its tables are keyed."""

    mark: str
    """The driver's parameter placeholder."""
    greatest: str
    """The function that gives the largest of its arguments."""
    lock_rows: str
    """Appended to a SELECT whose rows the transaction then changes: row locks where
    other writers run beside it, nothing where a write transaction locks the whole file."""
    scope: tuple[str, ...]
    """Columns that name the agent, ahead of each table's own key: a PostgreSQL table
    holds every agent's rows, a SQLite file is one agent's."""

    def marks(self, count: int) -> str:
        """``count`` placeholders, comma-separated."""
        return ", ".join([self.mark] * count)

    def columns(self, names: str) -> str:
        """``names`` (a column list) after the scope columns."""
        return ", ".join((*self.scope, names))

    def where(self, *names: str, also: str = "") -> str:
        """``scope = ? AND ... AND name = ?`` for the scope columns and ``names``, then
        ``also`` (conditions with their own placeholders, if any)."""
        equal = [f"{name} = {self.mark}" for name in (*self.scope, *names)]
        return " AND ".join([*equal, also] if also else equal)


SQLITE = Dialect(mark="?", greatest="MAX", lock_rows="", scope=())
"""One agent's SQLite file; a write transaction (``BEGIN IMMEDIATE``) locks all of it."""

POSTGRES = Dialect(mark="%s", greatest="GREATEST", lock_rows=" FOR UPDATE", scope=("agent_id",))
"""The shared PostgreSQL database: every table keyed by agent id first."""
