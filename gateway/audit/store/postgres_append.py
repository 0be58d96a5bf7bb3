"""The PostgreSQL side of the audit writer: one shared table, one hash chain per agent id.

Several agents (and several replicas of one agent id) append to the same
``audit_records`` table. Each batch locks its agent's row of ``audit_heads``
(``SELECT ... FOR UPDATE``) and re-reads the head inside the transaction, so
concurrent writers of one chain take turns and writers of other chains never
wait for each other. Used only from the audit writer thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import psycopg

from gateway.audit.chain import GENESIS_HASH, fields_hash
from gateway.audit.record import AuditRecord
from gateway.audit.store.sqlite_schema import CHAIN_COLUMNS, RECORD_COLUMNS
from gateway.audit.store.store import ChainWriter
from gateway.errors import AuditUnavailable
from gateway.postgres.migrations import created_record_columns, migrate
from gateway.postgres.source import ConnectionSource

_INSERT = (
    f"INSERT INTO audit_records (agent_id, {', '.join(RECORD_COLUMNS + CHAIN_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * (1 + len(RECORD_COLUMNS) + len(CHAIN_COLUMNS)))})"
)
CONNECT_TIMEOUT_SECONDS = 5
_SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE PRECISION"}


def audit_columns_covered() -> bool:
    """True if the PostgreSQL migrations create every ``RECORD_COLUMNS`` field
    with the SQL type of its ``AuditRecord`` field (int, float, else text; a test checks)."""
    # A field's type is its annotation's text (the record module postpones annotations).
    wanted = {field.name: _SQL_TYPES.get(str(field.type), "TEXT") for field in fields(AuditRecord)}
    created = created_record_columns()
    return all(created.get(name) == wanted[name] for name in RECORD_COLUMNS)


class PostgresChainWriter(ChainWriter):
    """Appends batches of one agent's records to the shared PostgreSQL audit table."""

    recoverable = True

    def __init__(self, source: ConnectionSource, agent_id: str) -> None:
        super().__init__()
        self._dsn = source
        self._agent_id = agent_id
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    @property
    def where(self) -> str:
        return f"audit database {self._dsn}"

    def open(self) -> None:
        """Connect, apply pending migrations and load this agent's chain head.

        Raises:
            AuditUnavailable: The database cannot be reached.
            ConfigError: Its schema is newer than this gateway knows.
        """
        try:
            self._conn = self._dsn.connect(
                timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True, bounded=True
            )
            migrate(self._conn, str(self._dsn))
            self._conn.execute(
                "INSERT INTO audit_heads VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
                (self._agent_id, GENESIS_HASH),
            )
            self.count, self.last_hash = self._load_head(self._conn)
        except psycopg.Error as err:
            self.close()
            raise AuditUnavailable(f"{self.where}: cannot open: {self._dsn.why(err)}") from err
        except BaseException:
            self.close()
            raise

    def append(self, records: Sequence[dict[str, object]]) -> None:
        """Assign seqs, chain and commit ``records`` in one transaction (see the module doc).

        Raises:
            AuditUnavailable: The transaction did not commit (or the connection
                was lost while committing); the head held here is unchanged.
        """
        conn = self._conn
        if conn is None:
            raise AuditUnavailable(f"{self.where}: not connected")
        try:
            with conn.transaction():
                head = conn.execute(
                    "SELECT count, last_hash FROM audit_heads WHERE agent_id = %s FOR UPDATE",
                    (self._agent_id,),
                ).fetchone()
                if head is None:
                    raise AuditUnavailable(f"{self.where}: chain head of {self._agent_id} missing")
                seq, prev = int(head[0]), str(head[1])  # type: ignore[call-overload]
                if seq < self.count:
                    raise AuditUnavailable(
                        f"{self.where}: chain head of {self._agent_id} moved back from seq "
                        f"{self.count} to {seq}; run the audit verify command"
                    )
                rows: list[tuple[object, ...]] = []
                for fields in records:
                    seq += 1
                    fields["seq"] = seq
                    digest = fields_hash(prev, fields)
                    rows.append(
                        (self._agent_id, *(fields[name] for name in RECORD_COLUMNS), prev, digest)
                    )
                    prev = digest
                with conn.cursor() as cursor:
                    cursor.executemany(_INSERT, rows)
                conn.execute(
                    "UPDATE audit_heads SET count = %s, last_hash = %s WHERE agent_id = %s",
                    (seq, prev, self._agent_id),
                )
        except psycopg.Error as err:
            raise AuditUnavailable(f"{self.where}: commit failed: {self._dsn.why(err)}") from err
        self.count, self.last_hash = seq, prev

    def probe(self) -> None:
        """One round trip on the writer's connection.

        Raises:
            AuditUnavailable: The server cannot be reached.
        """
        conn = self._conn
        if conn is None:
            raise AuditUnavailable(f"{self.where}: not connected")
        try:
            conn.execute("SELECT 1")
        except psycopg.Error as err:
            raise AuditUnavailable(f"{self.where}: unreachable: {self._dsn.why(err)}") from err

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _load_head(self, conn: psycopg.Connection[tuple[object, ...]]) -> tuple[int, str]:
        head = conn.execute(
            "SELECT count, last_hash FROM audit_heads WHERE agent_id = %s", (self._agent_id,)
        ).fetchone()
        last = conn.execute(
            "SELECT seq, record_hash FROM audit_records WHERE agent_id = %s "
            "ORDER BY seq DESC LIMIT 1",
            (self._agent_id,),
        ).fetchone()
        assert head is not None
        found = (0, GENESIS_HASH) if last is None else (int(last[0]), str(last[1]))  # type: ignore[call-overload]
        count, last_hash = int(head[0]), str(head[1])  # type: ignore[call-overload]
        if found != (count, last_hash):
            raise AuditUnavailable(
                f"{self.where}: chain head of {self._agent_id} (count {count}) does not match "
                f"its last record (seq {found[0]}); run the audit verify command"
            )
        return count, last_hash
