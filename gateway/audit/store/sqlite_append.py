"""Audit chain writers: the interface, and its SQLite side (one connection, one
transaction per batch).

Used only from the audit writer thread (see :mod:`gateway.audit.log`), which
owns the connection for its whole life. The PostgreSQL side is
:mod:`gateway.audit.store.postgres_append`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from gateway.audit.chain import GENESIS_HASH, chained_row
from gateway.audit.store.sqlite_schema import (
    DDL,
    INSERT_RECORDS,
    MIGRATE_1_TO_2,
    ROWS_PER_INSERT,
    SCHEMA_VERSION,
)
from gateway.audit.store.store import ChainWriter
from gateway.errors import AuditUnavailable
from gateway.local.private_files import connect_private


class SqliteChainWriter(ChainWriter):
    """The chain of one agent in one SQLite (WAL) file."""

    def __init__(self, path: Path, *, busy_timeout_ms: int, synchronous: str = "FULL") -> None:
        super().__init__()
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = None

    @property
    def where(self) -> str:
        return f"audit log {self._path}"

    def open(self) -> None:
        """Open (creating if needed) the database and load the chain head.

        Raises:
            AuditUnavailable: The file cannot be opened for writing, is not an
                audit log of a known schema, or its chain head does not match
                its last record.
        """
        try:
            self._conn = connect_private(
                self._path,
                timeout=self._busy_timeout_ms / 1000,
                isolation_level=None,
            )
            self._configure(self._conn)
            self._create_schema(self._conn)
            self.count, self.last_hash = self._load_head(self._conn)
        except sqlite3.Error as err:
            self.close()
            raise AuditUnavailable(f"audit log {self._path}: cannot open: {err}") from err
        except AuditUnavailable:
            self.close()
            raise

    def append(self, records: Sequence[dict[str, object]]) -> None:
        """Assign seqs, chain and commit ``records`` in one transaction.

        Args:
            records: Records as ``record.checked_fields`` returns them; their
                ``seq`` is overwritten here.

        The head is read again inside the write transaction, so another
        process may append to the same log in between (the operator CLI
        records its idempotency resolutions this way while the agent runs).

        Raises:
            AuditUnavailable: The transaction did not commit; nothing of the
                batch is stored and the head is unchanged.
        """
        conn = self._require_conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            head = conn.execute("SELECT count, last_hash FROM chain_head WHERE id = 1").fetchone()
            if head is None:
                raise sqlite3.IntegrityError("chain_head row is missing")
            seq, prev = int(head[0]), str(head[1])
            if seq < self.count or (seq == self.count and prev != self.last_hash):
                # Another writer only ever adds records: a head that went back
                # (or changed in place) means the log was cut or rewritten.
                raise sqlite3.IntegrityError(
                    f"chain head moved back from seq {self.count} to {seq} while open; "
                    "run the audit verify command"
                )
            for first in range(0, len(records), ROWS_PER_INSERT):
                chunk = records[first : first + ROWS_PER_INSERT]
                values: list[object] = []
                for fields in chunk:
                    seq += 1
                    fields["seq"] = seq
                    row, prev = chained_row(prev, fields)
                    values += row
                # Rows in one statement, not one step each (executemany): every
                # sqlite3 step hands the GIL to the event loop and waits to get
                # it back, and that hand-off cost more than the insert itself.
                conn.execute(INSERT_RECORDS[len(chunk)], values)
            updated = conn.execute(
                "UPDATE chain_head SET count = ?, last_hash = ? WHERE id = 1", (seq, prev)
            ).rowcount
            if updated != 1:
                raise sqlite3.IntegrityError("chain_head row is missing")
            conn.execute("COMMIT")
        except sqlite3.Error as err:
            self._rollback(conn)
            raise AuditUnavailable(f"audit log {self._path}: commit failed: {err}") from err
        self.count, self.last_hash = seq, prev

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _configure(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise AuditUnavailable(
                f"audit log {self._path}: cannot use WAL journal mode (got {mode!r})"
            )
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, SCHEMA_VERSION):
            raise AuditUnavailable(
                f"audit log {self._path}: unknown schema version {version} "
                f"(this gateway writes version {SCHEMA_VERSION})"
            )

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        # A write transaction even when the schema exists: a file we can read
        # but not write must fail here, not at the first record.
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] == 1:
                conn.execute(MIGRATE_1_TO_2)
            for statement in DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO chain_head (id, count, last_hash) VALUES (1, 0, ?)",
                (GENESIS_HASH,),
            )
            conn.execute("UPDATE chain_head SET count = count WHERE id = 1")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            self._rollback(conn)
            raise

    def _load_head(self, conn: sqlite3.Connection) -> tuple[int, str]:
        count, last_hash = conn.execute(
            "SELECT count, last_hash FROM chain_head WHERE id = 1"
        ).fetchone()
        last = conn.execute(
            "SELECT seq, record_hash FROM audit_records ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        found = (0, GENESIS_HASH) if last is None else (last[0], last[1])
        if found != (count, last_hash):
            raise AuditUnavailable(
                f"audit log {self._path}: chain head (count {count}) does not match the "
                f"last record (seq {found[0]}); run the audit verify command"
            )
        return int(count), str(last_hash)

    def _require_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise AuditUnavailable(f"audit log {self._path}: not open")
        return self._conn

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the transaction is gone either way; the caller reports the cause
