"""Operator actions on idempotency keys kept in PostgreSQL (``state_db`` a DSN).

The same actions and rules as :mod:`gateway.admin.idempotency.sqlite`: list,
resolve (store the observed outcome) or release a key in doubt, each audited
in the agent's audit log before the change is committed. The key's row is
locked ``FOR UPDATE`` for the whole action, so no replica claims or
completes it meanwhile. A ``claimed`` row whose owner process is gone (or
that is older than :data:`~gateway.inbound.idempotency.postgres.STALE_CLAIM`) is
treated as in doubt: no replica can still be running it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from capabilities.runner import CapabilityResult
from gateway.admin.idempotency.sqlite import audit_action, in_doubt_entry, key_entry
from gateway.admin.idempotency.store import (
    RELEASED,
    RESOLVED,
    AuditTarget,
    KeyEntry,
    OutputCheck,
    Resolution,
)
from gateway.errors import ConfigError, StateUnavailable
from gateway.inbound.idempotency.postgres import STALE_CLAIM
from gateway.inbound.idempotency.store import Ident
from gateway.local.process_owner import holder_gone
from gateway.postgres.source import ConnectionSource

_SELECT = (
    "SELECT peer, capability, key, state, served_version, request_sha256, "
    "COALESCE(LENGTH(payload), 0), updated_unix_ms, claim_owner FROM idempotency"
)
_KEY = " WHERE agent_id = %s AND peer = %s AND capability = %s AND key = %s"
Connection = psycopg.Connection[tuple[Any, ...]]


def _connect(dsn: ConnectionSource) -> Connection:
    try:
        return dsn.connect(timeout=10)
    except psycopg.Error as err:
        raise StateUnavailable(f"idempotency store {dsn}: {dsn.why(err)}") from err


def _as_seen(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The row's fields, with a cut-off claim shown as what it is: in doubt."""
    stale_ms = int(time.time() * 1000) - int(STALE_CLAIM.total_seconds() * 1000)
    if row[3] == "claimed" and (holder_gone(str(row[8])) or int(row[7]) < stale_ms):
        return (*row[:3], "in_doubt", *row[4:8])
    return row[:8]


def list_keys_pg(dsn: ConnectionSource, agent_id: str, *, in_doubt_only: bool) -> list[KeyEntry]:
    """Every key of ``agent_id`` (or only those in doubt), oldest change first."""
    with _connect(dsn) as conn:
        try:
            rows = conn.execute(
                _SELECT + " WHERE agent_id = %s ORDER BY updated_unix_ms, peer, capability, key",
                (agent_id,),
            ).fetchall()
        except psycopg.Error as err:
            raise StateUnavailable(f"idempotency store {dsn}: {dsn.why(err)}") from err
    entries = [key_entry(_as_seen(row)) for row in rows]
    return [e for e in entries if e.state == "in_doubt"] if in_doubt_only else entries


def resolve_done_pg(
    dsn: ConnectionSource,
    audit_db: AuditTarget,
    agent_id: str,
    ident: Ident,
    output: dict[str, Any],
    reason: str,
    check_output: OutputCheck | None = None,
) -> Resolution:
    """:func:`~gateway.admin.idempotency.sqlite.resolve_done` for a PostgreSQL store."""
    if not isinstance(output, dict):
        raise ConfigError("the output must be a JSON object")
    result: list[CapabilityResult] = []

    def apply(conn: Connection, entry: KeyEntry) -> bytes:
        checked = output if check_output is None else check_output(entry, output)
        result.append(CapabilityResult.from_output(checked))
        return result[0].payload

    def store(conn: Connection) -> None:
        conn.execute(
            "UPDATE idempotency SET state = 'done', payload = %s, evidence_sha256 = %s, "
            "updated_unix_ms = %s" + _KEY,
            (
                result[0].payload,
                result[0].evidence_sha256,
                int(time.time() * 1000),
                agent_id,
                *ident,
            ),
        )

    entry, seq = _change(dsn, audit_db, agent_id, ident, reason, RESOLVED, apply, store)
    return Resolution("resolved", entry, seq, len(result[0].payload), result[0].evidence_sha256)


def release_key_pg(
    dsn: ConnectionSource, audit_db: AuditTarget, agent_id: str, ident: Ident, reason: str
) -> Resolution:
    """:func:`~gateway.admin.idempotency.sqlite.release_key` for a PostgreSQL store."""

    def delete(conn: Connection) -> None:
        conn.execute("DELETE FROM idempotency" + _KEY, (agent_id, *ident))

    entry, seq = _change(
        dsn, audit_db, agent_id, ident, reason, RELEASED, lambda conn, entry: b"", delete
    )
    return Resolution("released", entry, seq)


def _change(
    dsn: ConnectionSource,
    audit_db: AuditTarget,
    agent_id: str,
    ident: Ident,
    reason: str,
    audit_reason: str,
    prepare: Callable[[Connection, KeyEntry], bytes],
    apply: Callable[[Connection], None],
) -> tuple[KeyEntry, int]:
    """Lock the key's row, check it is in doubt, audit the action, apply it, commit."""
    reason = reason.strip()
    if not reason:
        raise ConfigError("a --reason is required: say what you checked")
    if isinstance(audit_db.where, Path) and not audit_db.where.is_file():
        raise ConfigError(f"audit log {audit_db.where}: no such file")
    with _connect(dsn) as conn:
        try:
            with conn.transaction():
                row = conn.execute(_SELECT + _KEY + " FOR UPDATE", (agent_id, *ident)).fetchone()
                entry = in_doubt_entry(ident, None if row is None else _as_seen(row))
                body = prepare(conn, entry)
                seq = audit_action(audit_db, entry, reason, audit_reason, body, agent_id)
                apply(conn)
        except psycopg.Error as err:
            raise StateUnavailable(f"idempotency store {dsn}: {dsn.why(err)}") from err
    return entry, seq


class PostgresKeyAdmin:
    """:class:`~gateway.admin.idempotency.store.KeyAdmin` of the keys every
    replica of an agent shares in PostgreSQL."""

    def __init__(self, dsn: ConnectionSource, audit_db: AuditTarget, agent_id: str) -> None:
        """``agent_id``'s keys at ``dsn``; actions audited to ``audit_db``."""
        self._dsn = dsn
        self._audit_db = audit_db
        self._agent_id = agent_id

    def keys(self, *, in_doubt_only: bool = False) -> list[KeyEntry]:
        """See :func:`list_keys_pg`."""
        return list_keys_pg(self._dsn, self._agent_id, in_doubt_only=in_doubt_only)

    def resolve_done(
        self,
        ident: Ident,
        output: dict[str, Any],
        reason: str,
        check_output: OutputCheck | None = None,
    ) -> Resolution:
        """See :func:`resolve_done_pg`."""
        return resolve_done_pg(
            self._dsn,
            self._audit_db,
            self._agent_id,
            ident,
            output,
            reason,
            check_output=check_output,
        )

    def release(self, ident: Ident, reason: str) -> Resolution:
        """See :func:`release_key_pg`."""
        return release_key_pg(self._dsn, self._audit_db, self._agent_id, ident, reason)
