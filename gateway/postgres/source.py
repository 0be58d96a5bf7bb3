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

    def connect(self, *, timeout: float, autocommit: bool = False) -> Connection:
        """A new connection (the caller closes it).

        Raises:
            psycopg.Error: The server cannot be reached or refused the login.
        """
        return psycopg.connect(self.url, autocommit=autocommit, connect_timeout=int(timeout))

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
