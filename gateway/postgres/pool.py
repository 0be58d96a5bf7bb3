"""Connections to the shared state database: one small pool per store, opened lazily.

The pool does not wait for the server at construction: an agent whose
database is down starts refusing calls that need it (``STATE_UNAVAILABLE``)
and works again once the server is back, without a restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from gateway.errors import StateUnavailable
from gateway.postgres.dsn import PostgresDsn
from gateway.postgres.migrations import migrate

_T = TypeVar("_T")
Connection = psycopg.Connection[tuple[object, ...]]
WAIT_SECONDS = 5.0
"""How long an operation waits for a connection before failing closed."""


class StatePool:
    """A psycopg pool for one store; every operation runs in one transaction.

    Args:
        dsn: The database.
        what: The store as named in messages, e.g. ``"idempotency store"``.
    """

    def __init__(self, dsn: PostgresDsn, what: str, *, max_size: int = 4) -> None:
        self._dsn = dsn
        self._what = what
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            dsn.url,
            min_size=1,
            max_size=max_size,
            open=False,
            kwargs={"connect_timeout": int(WAIT_SECONDS)},
            name=what,
        )
        self._pool.open(wait=False)
        self._migrated = False

    def run(self, work: Callable[[Connection], _T]) -> _T:
        """``work(conn)`` in one transaction; committed if it returns.

        Raises:
            StateUnavailable: no connection within ``WAIT_SECONDS``, or the
                database failed the transaction.
        """
        try:
            with self._pool.connection(timeout=WAIT_SECONDS) as conn:
                if not self._migrated:
                    conn.autocommit = True
                    migrate(conn, str(self._dsn))
                    conn.autocommit = False
                    self._migrated = True
                with conn.transaction():
                    return work(conn)
        except psycopg.Error as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise StateUnavailable(f"{self._what} {self._dsn}: {first}") from err

    def close(self) -> None:
        """Close every connection."""
        self._pool.close()
