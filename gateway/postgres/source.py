"""A connection source: how the PostgreSQL stores reach their database without holding a DSN.

The storage factory (``gateway.storage``) builds one from the configured DSN and
hands it (or a :class:`~gateway.postgres.pool.StatePool` over it) to each
PostgreSQL store. A store connects through it and names the database in its
messages through it, always without credentials; it never sees the URL type,
so only the factory decides what a location is.
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

Connection = psycopg.Connection[tuple[Any, ...]]

ANSWER_SECONDS = 30.0
"""Longest an agent's store waits for one answer of the server (a statement, a
commit). A server that went silent (a partition, a host gone without a reset)
would otherwise hold the call, and the audit writer, until TCP gives up."""


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within ``ANSWER_SECONDS``; the connection was closed."""


class BoundedConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection whose every round trip gives up after ``ANSWER_SECONDS``."""

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) < 2 and kwargs.get("timeout") is None:
            kwargs["timeout"] = ANSWER_SECONDS
        try:
            return super().wait(gen, *args, **kwargs)
        except psycopg.errors._WaitTimeout:
            # The statement is still in flight: the connection cannot be reused.
            self.pgconn.finish()
            raise NoAnswer(f"no answer from the server within {ANSWER_SECONDS:g} s") from None


class Database(Protocol):
    """What a source needs of a database address (the DSN type provides it)."""

    @property
    def url(self) -> str:
        """The URL as configured (for the driver only)."""

    def scrub(self, text: str) -> str:
        """``text`` without the address's secrets."""

    def why(self, err: BaseException) -> str:
        """The first line of a driver error, without the address's secrets."""


class ConnectionSource:
    """Opens connections to one PostgreSQL database; ``str()`` names it without secrets."""

    def __init__(self, database: Database) -> None:
        """Connect to ``database`` on demand (nothing is opened yet)."""
        self._database = database

    @property
    def url(self) -> str:
        """The URL as configured: for a driver's pool only, never for a message."""
        return self._database.url

    def connect(
        self, *, timeout: float, autocommit: bool = False, bounded: bool = False
    ) -> Connection:
        """A new connection (the caller closes it); ``bounded``: a
        :class:`BoundedConnection` (an agent's writer; operator reads may take long).

        Raises:
            psycopg.Error: The server cannot be reached or refused the login.
        """
        kind = BoundedConnection if bounded else psycopg.Connection
        return kind.connect(self.url, autocommit=autocommit, connect_timeout=int(timeout))

    def scrub(self, text: str) -> str:
        """``text`` (e.g. a driver's message) without the database's secrets."""
        return self._database.scrub(text)

    def why(self, err: BaseException) -> str:
        """The first line of a driver error about this database, scrubbed."""
        return self._database.why(err)

    def __str__(self) -> str:
        return str(self._database)

    def __repr__(self) -> str:
        return f"ConnectionSource({self!s})"
