"""PostgreSQL as the shared store of a fleet: DSNs, versioned schema migrations, connections.

SQLite stays the embedded default; a setting whose value starts with
``postgresql://`` (or ``postgres://``) selects PostgreSQL instead (see
:func:`gateway.postgres.dsn.parse_location`).
"""

from gateway.postgres.dsn import PostgresDsn, StoreLocation, is_dsn, parse_location

__all__ = ["PostgresDsn", "StoreLocation", "is_dsn", "parse_location"]
