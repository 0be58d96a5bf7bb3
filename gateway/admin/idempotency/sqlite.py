"""Operator actions on idempotency keys: list them, resolve or release one in doubt.

A key in doubt (an attempt was cut off mid-run) answers ``IDEMPOTENCY_IN_DOUBT``
until an operator, having looked at the capability's real state, either

- *resolves* it with the outcome they observed: the answer is stored as if the
  attempt had finished, and a retry gets it replayed (the write never runs
  again); or
- *releases* it: the key is freed and the next call with it runs the write
  (only right when the operator checked the write did not happen).

Both run in one SQLite write transaction on the store that changes only a row
still ``in_doubt`` (a running agent may hold the file open), and both are
audited in the agent's audit log before the change is committed: reason
``IDEMPOTENCY_RESOLVED`` / ``IDEMPOTENCY_RELEASED``, the key's peer and
capability, the operator's reason in ``detail``, and for a resolution the
stored output's size and SHA-256 (never its content).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from capabilities.runner import CapabilityResult
from gateway.admin.idempotency.store import (
    MAX_REASON_CHARS,
    RELEASED,
    RESOLVED,
    AuditTarget,
    KeyEntry,
    OutputCheck,
    Resolution,
)
from gateway.audit.record import AuditRecord, checked_fields
from gateway.errors import ConfigError, IdempotencyNotInDoubt, StateUnavailable
from gateway.inbound.idempotency.store import Ident, open_store_db

_MAX_KEY_CHARS = 128

_Prepared = TypeVar("_Prepared")


class SqliteKeyAdmin:
    """:class:`KeyAdmin` of an agent's ``idempotency.sqlite``."""

    def __init__(self, store: Path, audit_db: AuditTarget, agent_id: str) -> None:
        """Keys in ``store``; actions audited to ``audit_db`` (``agent_id``'s chain)."""
        self._store = store
        self._audit_db = audit_db
        self._agent_id = agent_id

    def keys(self, *, in_doubt_only: bool = False) -> list[KeyEntry]:
        """See :func:`list_keys`."""
        return list_keys(self._store, in_doubt_only=in_doubt_only)

    def resolve_done(
        self,
        ident: Ident,
        output: dict[str, Any],
        reason: str,
        check_output: OutputCheck | None = None,
    ) -> Resolution:
        """See :func:`resolve_done`."""
        return resolve_done(
            self._store,
            self._audit_db,
            ident,
            output,
            reason,
            check_output=check_output,
            agent_id=self._agent_id,
        )

    def release(self, ident: Ident, reason: str) -> Resolution:
        """See :func:`release_key`."""
        return release_key(self._store, self._audit_db, ident, reason, agent_id=self._agent_id)


def list_keys(store: Path, *, in_doubt_only: bool = False) -> list[KeyEntry]:
    """Every key in the store (or only those in doubt), oldest change first.

    Raises:
        ConfigError: there is no store at ``store``.
        StateUnavailable: it cannot be read.
    """
    where = " WHERE state = 'in_doubt'" if in_doubt_only else ""
    with _connect(store) as db:
        rows = db.execute(f"{_SELECT}{where} ORDER BY updated_unix_ms, peer, capability, key")
        return [key_entry(row) for row in rows.fetchall()]


def resolve_done(
    store: Path,
    audit_db: AuditTarget,
    ident: Ident,
    output: dict[str, Any],
    reason: str,
    check_output: OutputCheck | None = None,
    agent_id: str = "",
) -> Resolution:
    """Store ``output`` as the answer of a key in doubt; a retry gets it replayed.

    Args:
        store: The agent's idempotency SQLite file.
        audit_db: The agent's audit log (a SQLite file or a PostgreSQL store).
        ident: (peer, capability, key).
        output: The outcome the operator observed, as the capability returns it.
        reason: What the operator checked (audited).
        check_output: Validates ``output`` for the key's capability and version.
        agent_id: The agent whose chain gets the record (needed with a DSN).

    Raises:
        ConfigError: ``reason`` is blank, ``output`` is not a JSON object or
            fails ``check_output``.
        IdempotencyNotInDoubt: the key is unknown, done, or still claimed.
        StateUnavailable / AuditUnavailable: the store or the audit log
            cannot be written (then nothing changed).
    """
    if not isinstance(output, dict):
        raise ConfigError("the output must be a JSON object")

    def prepare(entry: KeyEntry) -> CapabilityResult:
        checked = output if check_output is None else check_output(entry, output)
        return CapabilityResult.from_output(checked)

    def store_answer(db: sqlite3.Connection, result: CapabilityResult) -> None:
        _change_one(
            db,
            "UPDATE idempotency SET state = 'done', payload = ?, evidence_sha256 = ?, "
            "updated_unix_ms = ?",
            (result.payload, result.evidence_sha256, _now_ms()),
            ident,
        )

    entry, seq, result = _change(
        store, (audit_db, agent_id), ident, reason, (RESOLVED, prepare, _payload_of), store_answer
    )
    return Resolution("resolved", entry, seq, len(result.payload), result.evidence_sha256)


def release_key(
    store: Path, audit_db: AuditTarget, ident: Ident, reason: str, agent_id: str = ""
) -> Resolution:
    """Free a key in doubt: the next call with it runs the write again.

    Raises:
        ConfigError: ``reason`` is blank.
        IdempotencyNotInDoubt: the key is unknown, done, or still claimed.
        StateUnavailable / AuditUnavailable: the store or the audit log
            cannot be written (then nothing changed).
    """

    def delete(db: sqlite3.Connection, result: None) -> None:
        _change_one(db, "DELETE FROM idempotency", (), ident)

    entry, seq, _ = _change(
        store, (audit_db, agent_id), ident, reason, (RELEASED, _nothing, _no_payload), delete
    )
    return Resolution("released", entry, seq)


_SELECT = (
    "SELECT peer, capability, key, state, served_version, request_sha256, "
    "COALESCE(LENGTH(payload), 0), updated_unix_ms FROM idempotency"
)
_IDENT = " WHERE peer = ? AND capability = ? AND key = ?"


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


@contextmanager
def _connect(store: Path) -> Iterator[sqlite3.Connection]:
    """The store, opened (and upgraded) for one action; never created here."""
    if not store.is_file():
        raise ConfigError(f"idempotency store {store}: no such file")
    try:
        db = open_store_db(store)
    except sqlite3.Error as err:
        raise StateUnavailable(f"idempotency store {store}: {err}") from err
    try:
        yield db
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()


def _change(
    store: Path,
    audit_log: tuple[AuditTarget, str],
    ident: Ident,
    reason: str,
    audit: tuple[str, Callable[[KeyEntry], _Prepared], Callable[[_Prepared], bytes]],
    apply: Callable[[sqlite3.Connection, _Prepared], None],
) -> tuple[KeyEntry, int, _Prepared]:
    """Check the key is in doubt, audit the action, apply it: one store transaction.

    ``audit`` is (reason code, what to prepare from the entry, the bytes of
    it that the record describes by size and digest); ``audit_log`` is
    (audit database, agent id).
    """
    audit_db, agent_id = audit_log
    audit_reason, prepare, payload_of = audit
    reason = reason.strip()
    if not reason:
        raise ConfigError("a --reason is required: say what you checked")
    if isinstance(audit_db.where, Path) and not audit_db.where.is_file():
        raise ConfigError(f"audit log {audit_db.where}: no such file")
    with _connect(store) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
            entry = in_doubt_entry(ident, db.execute(_SELECT + _IDENT, ident).fetchone())
            result = prepare(entry)
            body = payload_of(result)
            seq = audit_action(audit_db, entry, reason, audit_reason, body, agent_id)
            apply(db, result)
            db.execute("COMMIT")
        except sqlite3.Error as err:
            raise StateUnavailable(f"idempotency store {store}: {err}") from err
    return entry, seq, result


def in_doubt_entry(ident: Ident, row: tuple[Any, ...] | None) -> KeyEntry:
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


def _change_one(
    db: sqlite3.Connection, statement: str, values: tuple[object, ...], ident: Ident
) -> None:
    changed = db.execute(statement + _IDENT + " AND state = 'in_doubt'", (*values, *ident)).rowcount
    if changed != 1:  # cannot happen inside our write transaction; never change blindly
        raise sqlite3.IntegrityError("the key changed under the transaction")


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


def _payload_of(result: CapabilityResult) -> bytes:
    return result.payload


def _nothing(entry: KeyEntry) -> None:
    return None


def _no_payload(nothing: None) -> bytes:
    return b""


def _now_ms() -> int:
    return int(time.time() * 1000)
