"""What every audit reader offers, and the SQLite one.

:class:`AuditReader` is the read side of an audit store; the operator tools
(``gateway audit``, ``gateway db``), the replay window's warm start and the
checkpoint check take one instead of asking what kind of store a location is.
The storage factory (``gateway.storage.open_audit_reader``) picks the implementation:
:class:`SqliteAuditReader` here, or
:class:`~gateway.audit.store.postgres_read.PostgresAuditReader` for the shared table.

Invariants every implementation keeps:

- It never writes, and may read while a gateway keeps appending.
- Each call reads one snapshot: rows and chain head agree with each other.
- Records come back in chain order (seq); a store that holds many agents'
  chains (:attr:`AuditReader.many_chains`) filters by ``agent``, a store of
  one chain ignores it.
- Unreadable stores raise :class:`~gateway.errors.ConfigError` naming them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from datetime import timedelta
from pathlib import Path

from gateway.audit.checkpoint_verify import sqlite_hashes_at
from gateway.audit.filter import AuditFilter
from gateway.audit.query import sqlite_query_records, sqlite_recent_request_ids
from gateway.audit.record import AuditRecord
from gateway.audit.verify import VerifyReport, sqlite_verify_chain


class SqliteAuditReader:
    """Reads one agent's audit log from its SQLite file, opened read-only per call."""

    def __init__(self, path: Path) -> None:
        """Read the log at ``path`` (nothing is opened yet)."""
        self._path = path

    @property
    def many_chains(self) -> bool:
        """False: a SQLite file holds one agent's chain."""
        return False

    def query(self, wanted: AuditFilter) -> list[AuditRecord]:
        """Records matching ``wanted``, in seq order (``wanted.agent`` is not needed)."""
        return sqlite_query_records(self._path, wanted)

    def recent_request_ids(
        self, *, agent: str, since: timedelta, limit: int, refusals: Collection[str]
    ) -> Iterator[tuple[str, str, int]]:
        """Streamed in pages, newest first (``agent`` is not needed)."""
        return sqlite_recent_request_ids(self._path, since=since, limit=limit, refusals=refusals)

    def verify(self, agent: str | None = None) -> VerifyReport:
        """Check the file's one chain against its head."""
        return sqlite_verify_chain(self._path)

    def hashes_at(self, agent: str, seqs: list[int]) -> tuple[int, dict[int, str]]:
        """From one snapshot of the file."""
        return sqlite_hashes_at(self._path, seqs)
