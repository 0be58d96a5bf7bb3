"""An operator's actions on the idempotency table: list the keys, resolve or release one.

A key in doubt (an attempt was cut off mid-run) answers ``IDEMPOTENCY_IN_DOUBT``
until an operator, having looked at the capability's real state, either

- *resolves* it with the outcome they observed: the answer is stored as if the
  attempt had finished, and a retry gets it as the stored answer (the write never runs
  again); or
- *releases* it: the key is freed and the next call with it runs the write
  (only right when the operator checked the write did not happen).

Each runs in one write transaction on the store that changes only the row it
read in doubt (a running agent may hold the store open: SQLite takes the
file's write lock, PostgreSQL locks the row ``FOR UPDATE``), and each is
audited in the agent's audit log before the change is committed: reason
``IDEMPOTENCY_RESOLVED`` / ``IDEMPOTENCY_RELEASED``, the key's peer and
capability, the operator's reason in ``detail``, and for a resolution the
stored output's size and SHA-256 (never its content).

:class:`KeyAdmin` runs the same statements on both backends (over a
:class:`~gateway.sql.dialect.Dialect`); a backend opens a connection per
action and never creates a store, and, unlike the serving store, never marks
anyone's claims in doubt. The storage factory
(:func:`gateway.storage.open_key_admin`) picks it.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from capabilities.runner import CapabilityResult
from gateway.audit.record import AuditRecord, checked_fields
from gateway.audit.store.store import ChainWriter
from gateway.errors import ConfigError, IdempotencyNotInDoubt, StateUnavailable
from gateway.inbound.idempotency.store import Ident
from gateway.postgres.dsn import StoreLocation
from gateway.sql.dialect import Dialect, SqlConnection

RESOLVED = "IDEMPOTENCY_RESOLVED"
"""Audit reason: an operator stored the observed outcome of a key in doubt."""
RELEASED = "IDEMPOTENCY_RELEASED"
"""Audit reason: an operator freed a key in doubt so the write may run again."""

MAX_REASON_CHARS = 200
"""Longest operator reason kept in the audit record's ``detail``."""
_MAX_KEY_CHARS = 128


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


@dataclass(frozen=True, slots=True)
class AdminStatements:
    """The operator's statements on the ``idempotency`` table, in one dialect."""

    list_keys: str
    read_key: str
    resolve: str
    release: str


_ENTRY = (
    "SELECT peer, capability, key, state, served_version, request_sha256, "
    "COALESCE(LENGTH(payload), 0), updated_unix_ms, claim_owner FROM idempotency"
)


@cache
def statements(sql: Dialect) -> AdminStatements:
    """Every statement of the operator's actions, built once per dialect."""
    key = sql.where("peer", "capability", "key")
    stored = f"{key} AND state = {sql.mark}"  # the state the action read, row still locked
    scope = f" WHERE {sql.where()}" if sql.scope else ""
    return AdminStatements(
        list_keys=f"{_ENTRY}{scope} ORDER BY updated_unix_ms, peer, capability, key",
        read_key=f"{_ENTRY} WHERE {key}{sql.lock_rows}",
        resolve=(
            f"UPDATE idempotency SET state = 'done', payload = {sql.mark}, "
            f"evidence_sha256 = {sql.mark}, updated_unix_ms = {sql.mark} WHERE {stored}"
        ),
        release=f"DELETE FROM idempotency WHERE {stored}",
    )


@dataclass(frozen=True, slots=True)
class _Change:
    """What an action does to the row, and the bytes its audit record describes."""

    statement: str
    values: tuple[object, ...]
    body: bytes


class KeyAdmin(ABC):
    """An operator's view of one agent's idempotency keys.

    Invariants every backend keeps: only a key ``in_doubt`` is ever changed
    (anything else raises :class:`~gateway.errors.IdempotencyNotInDoubt`);
    each change is written to the agent's audit log, committed, before it
    returns; nothing is changed when the audit record cannot be written.

    Args:
        sql: The backend's dialect.
        scope: The values of ``sql.scope`` (the agent id in a shared table).
        audit_db: Where actions are audited.
        agent_id: The agent whose chain gets the records.
    """

    def __init__(
        self, sql: Dialect, scope: tuple[str, ...], audit_db: AuditTarget, agent_id: str
    ) -> None:
        self._sql = statements(sql)
        self._scope = scope
        self._audit_db = audit_db
        self._agent_id = agent_id

    @property
    @abstractmethod
    def where(self) -> str:
        """The store as named in messages (no secrets)."""

    @abstractmethod
    def _connection(self, *, write: bool) -> AbstractContextManager[SqlConnection]:
        """A connection for one action, in one transaction that commits when the
        block ends without an exception (``write``: holding the write lock from the start).

        Raises:
            ConfigError: there is no store (it is never created here).
            StateUnavailable: it cannot be opened, read or written.
        """

    def _seen(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """The row as the operator sees it (a backend may show a cut-off claim in doubt)."""
        return row

    def keys(self, *, in_doubt_only: bool = False) -> list[KeyEntry]:
        """Every key (or only those in doubt), oldest change first.

        Raises:
            ConfigError: there is no store.
            StateUnavailable: it cannot be read.
        """
        with self._connection(write=False) as conn:
            rows = conn.execute(self._sql.list_keys, self._scope).fetchall()
        entries = [key_entry(self._seen(row)) for row in rows]
        return [e for e in entries if e.state == "in_doubt"] if in_doubt_only else entries

    def resolve_done(
        self,
        ident: Ident,
        output: dict[str, Any],
        reason: str,
        check_output: OutputCheck | None = None,
    ) -> Resolution:
        """Store ``output`` as the answer of a key in doubt; a retry gets it as the stored answer.

        Args:
            ident: (peer, capability, key).
            output: The outcome the operator observed, as the capability returns it.
            reason: What the operator checked (audited).
            check_output: Validates ``output`` for the key's capability and version.

        Raises:
            ConfigError: ``reason`` is blank, ``output`` is not a JSON object or
                fails ``check_output``.
            IdempotencyNotInDoubt: the key is unknown, done, or still claimed.
            StateUnavailable / AuditUnavailable: the store or the audit log
                cannot be written (then nothing changed).
        """
        if not isinstance(output, dict):
            raise ConfigError("the output must be a JSON object")
        results: list[CapabilityResult] = []

        def answer(entry: KeyEntry) -> _Change:
            result = CapabilityResult.from_output(
                output if check_output is None else check_output(entry, output)
            )
            results.append(result)
            values = (result.payload, result.evidence_sha256, _now_ms())
            return _Change(self._sql.resolve, values, result.payload)

        entry, seq = self._change(ident, reason, RESOLVED, answer)
        stored = results[0]
        return Resolution("resolved", entry, seq, len(stored.payload), stored.evidence_sha256)

    def release(self, ident: Ident, reason: str) -> Resolution:
        """Free a key in doubt: the next call with it runs the write again.

        Raises:
            ConfigError: ``reason`` is blank.
            IdempotencyNotInDoubt: the key is unknown, done, or still claimed.
            StateUnavailable / AuditUnavailable: the store or the audit log
                cannot be written (then nothing changed).
        """
        entry, seq = self._change(
            ident, reason, RELEASED, lambda entry: _Change(self._sql.release, (), b"")
        )
        return Resolution("released", entry, seq)

    def _change(
        self, ident: Ident, reason: str, action: str, prepare: Callable[[KeyEntry], _Change]
    ) -> tuple[KeyEntry, int]:
        """Read the key (locked), check it is in doubt, audit the action, apply it, commit."""
        reason = reason.strip()
        if not reason:
            raise ConfigError("a --reason is required: say what you checked")
        if isinstance(self._audit_db.where, Path) and not self._audit_db.where.is_file():
            raise ConfigError(f"audit log {self._audit_db.where}: no such file")
        key = (*self._scope, *ident)
        with self._connection(write=True) as conn:
            row = conn.execute(self._sql.read_key, key).fetchone()
            entry = in_doubt_entry(ident, None if row is None else self._seen(row))
            assert row is not None
            change = prepare(entry)
            seq = audit_action(self._audit_db, entry, reason, action, change.body, self._agent_id)
            changed = conn.execute(change.statement, (*change.values, *key, row[3])).rowcount
            if changed != 1:  # cannot happen while the row is locked; never change blindly
                raise StateUnavailable(
                    f"idempotency store {self.where}: the key changed under the transaction"
                )
        return entry, seq


def key_entry(row: Sequence[Any]) -> KeyEntry:
    """A KeyEntry from (peer, capability, key, state, version, request sha, size, updated)."""
    return KeyEntry(
        str(row[0]),
        str(row[1]),
        str(row[2]),
        str(row[3]),
        str(row[4]),
        str(row[5]),
        int(row[6]),
        int(row[7]),
    )


def in_doubt_entry(ident: Ident, row: tuple[Any, ...] | None) -> KeyEntry:
    """The entry of ``row`` (``ident``'s), which must be in doubt.

    Raises:
        IdempotencyNotInDoubt: there is no such key, or it is done or claimed.
    """
    peer, capability, key = ident
    name = f"idempotency key {key!r} of {peer} for {capability}"
    if row is None:
        raise IdempotencyNotInDoubt(f"{name}: no such key")
    entry = key_entry(row)
    if entry.state == "done":
        raise IdempotencyNotInDoubt(f"{name}: already done (its answer is stored); nothing to do")
    if entry.state != "in_doubt":
        raise IdempotencyNotInDoubt(
            f"{name}: claimed by an attempt that may still be running; left unchanged "
            "(if the agent that claimed it is gone, starting the agent marks it in doubt)"
        )
    return entry


def audit_action(
    audit_db: AuditTarget,
    entry: KeyEntry,
    reason: str,
    audit_reason: str,
    body: bytes,
    agent_id: str = "",
) -> int:
    """Append the action's record to the agent's audit log (committed); returns its seq."""
    record = AuditRecord(
        time_unix_ms=_now_ms(),
        request_id=f"operator-{secrets.token_hex(8)}",
        peer_id=entry.peer,
        capability=entry.capability[:_MAX_KEY_CHARS],
        version_constraint="",
        served_version=entry.served_version,
        decision="allow",
        reason=audit_reason,
        payload_size=len(body),
        payload_sha256=hashlib.sha256(body).hexdigest(),
        latency_ms=0.0,
        detail=f"key {entry.key[:_MAX_KEY_CHARS]!r}; operator: {reason[:MAX_REASON_CHARS]}",
    )
    writer = audit_db.open_writer(agent_id)
    writer.open()
    try:
        writer.append([checked_fields(record)])
        return writer.count
    finally:
        writer.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
