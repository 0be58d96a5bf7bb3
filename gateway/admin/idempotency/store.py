"""What the operator sees of idempotency keys and may do to them, whichever store holds them.

A key in doubt (an attempt was cut off mid-run) answers ``IDEMPOTENCY_IN_DOUBT``
until an operator resolves or releases it; each action is audited. Backends:
``sqlite`` (an agent's ``idempotency.sqlite``) and ``postgres`` (the shared table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.audit.store.store import ChainWriter
from gateway.inbound.idempotency.store import Ident
from gateway.postgres.dsn import StoreLocation

RESOLVED = "IDEMPOTENCY_RESOLVED"
"""Audit reason: an operator stored the observed outcome of a key in doubt."""
RELEASED = "IDEMPOTENCY_RELEASED"
"""Audit reason: an operator freed a key in doubt so the write may run again."""

MAX_REASON_CHARS = 200
"""Longest operator reason kept in the audit record's ``detail``."""


@dataclass(frozen=True)
class AuditTarget:
    """Where an operator's action on a key is recorded: the agent's audit log.

    Attributes:
        where: The log (a SQLite file, which must exist, or a PostgreSQL store).
        open_writer: Opens a writer on ``agent_id``'s chain there (the storage
            factory's choice of backend; the admin code never picks one).
    """

    where: StoreLocation
    open_writer: Callable[[str], ChainWriter]


@dataclass(frozen=True)
class KeyEntry:
    """One idempotency key as stored."""

    peer: str
    """The calling peer's SPIFFE ID."""
    capability: str
    """Capability name."""
    key: str
    """The idempotency key."""
    state: str
    """``claimed`` (an attempt is running), ``in_doubt`` or ``done``."""
    served_version: str
    """Version that ran (or was about to)."""
    request_sha256: str
    """Digest of the request payload that claimed the key."""
    output_size: int
    """Size of the stored answer (0 unless done)."""
    updated_unix_ms: int
    """Last change of the row."""

    def to_json_dict(self) -> dict[str, Any]:
        """All fields as a JSON-ready dict."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Resolution:
    """What an operator action did."""

    action: Literal["resolved", "released"]
    """Which action."""
    entry: KeyEntry
    """The key as it was (in doubt)."""
    audit_seq: int
    """Seq of the audit record of this action."""
    output_size: int = 0
    """Size of the stored answer (resolve only)."""
    output_sha256: str = ""
    """SHA-256 of the stored answer (resolve only)."""


OutputCheck = Callable[[KeyEntry, dict[str, Any]], dict[str, Any]]
"""Checks an operator's output against the contract of the key's capability
and version; returns it normalised, or raises ConfigError."""


class KeyAdmin(Protocol):
    """An operator's view of one agent's idempotency keys.

    Invariants every implementation keeps: only a key ``in_doubt`` is ever
    changed (anything else raises :class:`~gateway.errors.IdempotencyNotInDoubt`);
    each change is written to the agent's audit log, committed, before it
    returns; nothing is changed when the audit record cannot be written.
    """

    def keys(self, *, in_doubt_only: bool = False) -> list[KeyEntry]:
        """Every key (or only those in doubt), as stored."""

    def resolve_done(
        self,
        ident: Ident,
        output: dict[str, Any],
        reason: str,
        check_output: OutputCheck | None = None,
    ) -> Resolution:
        """Store the observed outcome of a key in doubt (see :func:`resolve_done`)."""

    def release(self, ident: Ident, reason: str) -> Resolution:
        """Free a key in doubt so the write may run again (see :func:`release_key`)."""
