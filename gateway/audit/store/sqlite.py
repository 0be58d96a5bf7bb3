"""One agent's audit log in a SQLite file (WAL): its chain writer and its reader.

:class:`SqliteChainWriter` owns one connection for the life of the audit
writer thread (see :mod:`gateway.audit.log`) and commits each batch in one
``BEGIN IMMEDIATE`` transaction; the file's one chain head is the
``chain_head`` row, re-read inside the transaction, so another process may
append in between (the operator CLI records its idempotency resolutions this
way while the agent runs). :class:`SqliteAuditReader` opens the file
read-only for each call, one read transaction each. The layout both share,
and the record columns the PostgreSQL store shares too, is
:mod:`gateway.audit.store.sqlite_schema`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Iterator, Sequence
from datetime import timedelta
from pathlib import Path

from gateway.audit.chain import GENESIS_HASH, chained_row
from gateway.audit.filter import AuditFilter
from gateway.audit.record import AuditRecord
from gateway.audit.store.sqlite_schema import (
    DDL,
    INSERT_RECORDS,
    MIGRATE_1_TO_2,
    MIGRATE_2_TO_3,
    ROWS_PER_INSERT,
    SCHEMA_VERSION,
    SELECT_CHAINED,
    SELECT_RECORDS,
    connect_read_only,
    readable_record,
)
from gateway.audit.store.store import AuditReader, ChainWriter
from gateway.audit.verify import VerifyReport, verify_rows
from gateway.errors import AuditUnavailable, ConfigError
from gateway.local.private_files import connect_private

_PAGE_ROWS = 10_000


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
        if version not in (0, 1, 2, SCHEMA_VERSION):
            raise AuditUnavailable(
                f"audit log {self._path}: unknown schema version {version} "
                f"(this gateway writes version {SCHEMA_VERSION})"
            )

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        # A write transaction even when the schema exists: a file we can read
        # but not write must fail here, not at the first record.
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 1:
                conn.execute(MIGRATE_1_TO_2)
            if version in (1, 2):
                for statement in MIGRATE_2_TO_3:
                    conn.execute(statement)
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


class SqliteAuditReader(AuditReader):
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
        wanted.check_limit()
        where, params = wanted.clauses("?")
        oldest_ms = wanted.oldest_ms()
        if oldest_ms is not None:
            where.append("time_unix_ms >= ?")
            params.append(oldest_ms)
        sql = SELECT_RECORDS + (f" WHERE {' AND '.join(where)}" if where else "")
        # The most recent ``limit`` rows, then back into seq order.
        sql += " ORDER BY seq DESC" + (" LIMIT ?" if wanted.limit is not None else "")
        if wanted.limit is not None:
            params.append(wanted.limit)
        conn = connect_read_only(self._path)
        try:
            rows = conn.execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise ConfigError(f"audit log {self._path}: cannot read: {err}") from err
        finally:
            conn.close()
        log = f"audit log {self._path}"
        return [readable_record(row, log, str(self._path)) for row in reversed(rows)]

    def recent_request_ids(
        self, *, agent: str, since: timedelta, limit: int, refusals: Collection[str]
    ) -> Iterator[tuple[str, str, int]]:
        """Streamed in pages, newest first (``agent`` is not needed)."""
        marks = ", ".join("?" for _ in refusals) or "NULL"
        sql = (
            "SELECT peer_id, request_id, time_unix_ms FROM audit_records "
            f"WHERE time_unix_ms >= ? AND (decision = 'allow' OR reason IN ({marks})) "
            "ORDER BY seq DESC LIMIT ?"
        )
        oldest_ms = int((time.time() - since.total_seconds()) * 1000)
        conn = connect_read_only(self._path)
        try:
            cursor = conn.execute(sql, (oldest_ms, *refusals, limit))
            while rows := cursor.fetchmany(_PAGE_ROWS):
                for peer_id, request_id, time_unix_ms in rows:
                    yield str(peer_id), str(request_id), int(time_unix_ms)
        except sqlite3.Error as err:
            raise ConfigError(f"audit log {self._path}: cannot read: {err}") from err
        finally:
            conn.close()

    def verify(self, agent: str | None = None) -> VerifyReport:
        """Check the file's one chain against its head."""
        conn = connect_read_only(self._path)
        try:
            # One read transaction: rows and head from the same snapshot, even
            # while a gateway keeps appending.
            conn.execute("BEGIN")
            raw = conn.execute(f"{SELECT_CHAINED} ORDER BY seq").fetchall()
            head_row = conn.execute(
                "SELECT count, last_hash FROM chain_head WHERE id = 1"
            ).fetchone()
        except sqlite3.Error as err:
            raise ConfigError(f"audit log {self._path}: cannot read: {err}") from err
        finally:
            conn.close()
        head = None if head_row is None else (int(head_row[0]), str(head_row[1]))
        return verify_rows(raw, head)

    def hashes_at(self, agent: str, seqs: list[int]) -> tuple[int, dict[int, str]]:
        """From one snapshot of the file."""
        conn = connect_read_only(self._path)
        try:
            conn.execute("BEGIN")  # one snapshot, even while a gateway appends
            last = int(
                conn.execute("SELECT COALESCE(MAX(seq), 0) FROM audit_records").fetchone()[0]
            )
            hashes: dict[int, str] = {}
            for seq in seqs:
                row = conn.execute(
                    "SELECT record_hash FROM audit_records WHERE seq = ?", (seq,)
                ).fetchone()
                if row is not None:
                    hashes[seq] = str(row[0])
        except sqlite3.Error as err:
            raise ConfigError(f"audit log {self._path}: cannot read: {err}") from err
        finally:
            conn.close()
        return last, hashes
