"""Where each kind of state lives, decided in one place.

:func:`open_stores` opens an agent's stores for its configuration;
:func:`open_chain_writer` and :func:`open_audit_reader` open one audit store
by its location; :func:`open_key_admin` gives the operator's view of the
idempotency keys; :func:`location` reads a setting's text as a location and
:func:`connection_source` gives the PostgreSQL stores their database. Nothing
else in the package asks whether a location is a SQLite file or a PostgreSQL
database, and the PostgreSQL stores never see a DSN.
"""

from gateway.storage.factory import (
    Stores,
    connection_source,
    location,
    open_audit_feed,
    open_audit_reader,
    open_chain_writer,
    open_key_admin,
    open_stores,
    prepare_shared_files,
)

__all__ = [
    "Stores",
    "connection_source",
    "location",
    "open_audit_feed",
    "open_audit_reader",
    "open_chain_writer",
    "open_key_admin",
    "open_stores",
    "prepare_shared_files",
]
