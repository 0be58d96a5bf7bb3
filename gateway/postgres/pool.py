"""Connections to the shared state database: one small pool per store, opened lazily.

The pool does not wait for the server at construction: an agent whose
database is down starts refusing calls that need it (``STATE_UNAVAILABLE``)
and works again once the server is back, without a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from gateway.errors import StateUnavailable
from gateway.postgres.migrations import migrate
from gateway.postgres.source import BoundedConnection, ConnectionSource, NoAnswer

_T = TypeVar("_T")
_POOL_LOG = logging.getLogger("psycopg.pool")
Connection = psycopg.Connection[tuple[object, ...]]
WAIT_SECONDS = 2.0
"""How long an operation waits for a connection before failing closed."""
FAIL_FAST_SECONDS = 1.0
"""After the server was found unreachable, operations fail at once for this long
(instead of each waiting ``WAIT_SECONDS``) while the pool reconnects."""


class _StaleConnection(Exception):
    """The pooled connection was dead; ``cause`` is what the driver said."""

    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _ScrubDsn(logging.Filter):
    """Takes the DSN's secrets out of what the pool logs (it logs the driver's
    message of each failed connect, and libpq quotes a malformed token verbatim)."""

    def __init__(self, source: ConnectionSource) -> None:
        super().__init__()
        self._source = source

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self._source.scrub(record.getMessage()), None
        return True


class StatePool:
    """A psycopg pool for one store; every operation runs in one transaction.

    Built by the storage factory and handed to a PostgreSQL store.

    Args:
        source: The database.
        what: The store as named in messages, e.g. ``"idempotency store"``.
    """

    def __init__(self, source: ConnectionSource, what: str, *, max_size: int = 8) -> None:
        self._source = source
        self._what = what
        self._scrub = _ScrubDsn(source)
        _POOL_LOG.addFilter(self._scrub)
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            source.url,
            min_size=1,
            max_size=max_size,
            open=False,
            connection_class=BoundedConnection,
            kwargs={"connect_timeout": int(WAIT_SECONDS)},
            name=what,
        )
        self._pool.open(wait=False)
        self._migrated = False
        self._max_size = max_size
        self._down_until = 0.0

    def run(self, work: Callable[[Connection], _T]) -> _T:
        """``work(conn)`` in one transaction; committed if it returns.

        Raises:
            StateUnavailable: no connection within ``WAIT_SECONDS``, or the
                database failed the transaction.
        """
        err: psycopg.Error
        if time.monotonic() < self._down_until:
            raise StateUnavailable(
                f"{self._what} {self._source}: unreachable a moment ago; reconnecting"
            )
        try:
            # A pooled connection the server dropped (e.g. it restarted) took its
            # transaction with it, so a retry on the next connection is safe; a
            # commit lost in flight shows up on the retry as the row already
            # there (a key in doubt, a replayed id), never as a second effect.
            # Every pooled connection may be stale: one more try than the pool holds.
            for _ in range(self._max_size):
                try:
                    return self._once(work)
                except _StaleConnection:
                    continue
            return self._once(work)
        except _StaleConnection as stale:
            err = stale.cause
            self._down_until = time.monotonic() + FAIL_FAST_SECONDS
        except (PoolTimeout, NoAnswer) as timeout:
            err = timeout
            self._down_until = time.monotonic() + FAIL_FAST_SECONDS
        except psycopg.Error as failed:
            err = failed
        raise StateUnavailable(f"{self._what} {self._source}: {self._source.why(err)}") from err

    def _once(self, work: Callable[[Connection], _T]) -> _T:
        with self._pool.connection(timeout=WAIT_SECONDS) as conn:
            try:
                if not self._migrated:
                    conn.autocommit = True
                    migrate(conn, str(self._source))
                    conn.autocommit = False
                    self._migrated = True
                with conn.transaction():
                    return work(conn)
            except psycopg.OperationalError as err:
                if conn.broken and not isinstance(err, NoAnswer):  # a silent server: no retry
                    raise _StaleConnection(err) from err
                raise

    def close(self) -> None:
        """Close every connection."""
        try:
            self._pool.close()
        finally:
            _POOL_LOG.removeFilter(self._scrub)
