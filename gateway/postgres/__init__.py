"""PostgreSQL as the shared store of a fleet: DSNs, versioned schema migrations, connections.

SQLite stays the embedded default; a setting whose value starts with
``postgresql://`` (or ``postgres://``) selects PostgreSQL instead (see
:func:`gateway.postgres.dsn.parse_location`). Only the storage factory
(``gateway.storage``) turns a DSN into what the stores use: a
:class:`~gateway.postgres.source.ConnectionSource`, or a
:class:`~gateway.postgres.pool.StatePool` over one.
"""

from gateway.postgres.dsn import StoreLocation, is_dsn, parse_location

__all__ = ["StoreLocation", "is_dsn", "parse_location"]
