"""The two sides of an audit store: ``ChainWriter`` appends, ``AuditReader`` reads.

Backends side by side: :mod:`~gateway.audit.store.sqlite` (one agent's file)
and :mod:`~gateway.audit.store.postgres` (the shared table, one chain per agent
id); :mod:`gateway.storage` picks one by location.

Unlike the other stores with two backends, the audit store shares no SQL over
a dialect, and keeps two sides: the chain is append-only, and what keeps it
whole differs by backend (one ``chain_head`` row in a file written by one
agent, whose batches go in as multi-row inserts, against an ``audit_heads``
row per agent locked ``FOR UPDATE`` among many writers), while readers of a
shared table query across agents. What both share is the record layout
(:mod:`gateway.audit.store.sqlite_schema`) and the chain itself
(:mod:`gateway.audit.chain`, :func:`gateway.audit.verify.verify_rows`). A writer
is opened by :meth:`ChainWriter.open` (and reopened after a failure) on the
audit writer thread, not when constructed; a reader opens a connection per
call, so it has nothing to open or close.

Invariants every reader keeps:

- It never writes, and may read while a gateway keeps appending.
- Each call reads one snapshot: rows and chain head agree with each other.
- Records come back in chain order (seq); a store that holds many agents'
  chains (:attr:`AuditReader.many_chains`) filters by ``agent``, a store of
  one chain ignores it.
- Unreadable stores raise :class:`~gateway.errors.ConfigError` naming them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from datetime import timedelta

from gateway.audit.chain import GENESIS_HASH
from gateway.audit.filter import AuditFilter
from gateway.audit.record import AuditRecord
from gateway.audit.verify import VerifyReport


class AuditReader(ABC):
    """Read-only access to one audit store (a SQLite file or a shared database)."""

    @property
    @abstractmethod
    def many_chains(self) -> bool:
        """True when the store holds the chains of many agents (one per agent id)."""

    @abstractmethod
    def query(self, wanted: AuditFilter) -> list[AuditRecord]:
        """Records matching ``wanted`` (see :func:`gateway.audit.query.query_records`)."""

    @abstractmethod
    def recent_request_ids(
        self, *, agent: str, since: timedelta, limit: int, refusals: Collection[str]
    ) -> Iterator[tuple[str, str, int]]:
        """(peer, request id, time) of recent allowed or ``refusals`` calls, newest first."""

    @abstractmethod
    def verify(self, agent: str | None = None) -> VerifyReport:
        """Check ``agent``'s chain (may be left out when the store holds one)."""

    @abstractmethod
    def hashes_at(self, agent: str, seqs: list[int]) -> tuple[int, dict[int, str]]:
        """The last seq of ``agent``'s chain and the record hashes at ``seqs``."""


class ChainWriter(ABC):
    """Appends batches of records to one hash chain, one committed transaction each.

    Attributes:
        count: Records stored so far (the seq of the last one).
        last_hash: ``record_hash`` of the last record (GENESIS_HASH when empty).
        recoverable: Whether a failed commit may be retried after reopening
            (a database server that went away can come back; a broken local
            file is for an operator to look at).
    """

    recoverable = False

    def __init__(self) -> None:
        self.count = 0
        self.last_hash = GENESIS_HASH

    @property
    @abstractmethod
    def where(self) -> str:
        """The store as named in messages (no secrets)."""

    @abstractmethod
    def open(self) -> None:
        """Open the store and load the chain head; AuditUnavailable if it cannot."""

    @abstractmethod
    def append(self, records: Sequence[dict[str, object]]) -> None:
        """Assign seqs, chain and commit ``records``; AuditUnavailable if not committed."""

    @abstractmethod
    def close(self) -> None:
        """Release the store (idempotent)."""

    def probe(self) -> None:
        """Check the store is reachable; AuditUnavailable if not (a local file always is)."""
        return None
