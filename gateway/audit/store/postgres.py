"""The audit log in PostgreSQL: one shared table, one hash chain per agent id.

Several agents (and several replicas of one agent id) append to the same
``audit_records`` table. :class:`PostgresChainWriter` locks its agent's row of
``audit_heads`` for each batch (``SELECT ... FOR UPDATE``) and re-reads the
head inside the transaction, so concurrent writers of one chain take turns and
writers of other chains never wait for each other; it is used only from the
audit writer thread, on a connection of its own. Readers
(:class:`PostgresAuditReader` and the functions below, which query across
agents and verify every agent's chain) use their own connection per call in a
REPEATABLE READ, read-only transaction, so rows and heads come from one
snapshot while agents keep appending.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import timedelta

import psycopg

from gateway.audit.chain import GENESIS_HASH, fields_hash
from gateway.audit.filter import AuditFilter
from gateway.audit.record import AuditRecord
from gateway.audit.store.sqlite_schema import CHAIN_COLUMNS, RECORD_COLUMNS, readable_record
from gateway.audit.store.store import AuditReader, ChainWriter
from gateway.audit.verify import VerifyReport, verify_rows
from gateway.errors import AuditUnavailable, ConfigError
from gateway.postgres.migrations import (
    LATEST_VERSION,
    created_record_columns,
    migrate,
    schema_version,
)
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


_PAGE_ROWS = 10_000
_SELECT = f"SELECT agent_id, {', '.join(RECORD_COLUMNS)} FROM audit_records"
_SELECT_CHAINED = f"SELECT {', '.join(RECORD_COLUMNS + CHAIN_COLUMNS)} FROM audit_records"


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """An audit record and the agent whose chain holds it."""

    agent_id: str
    record: AuditRecord


def read_connection(dsn: ConnectionSource) -> psycopg.Connection[tuple[object, ...]]:
    """A read-only, REPEATABLE READ connection to the audit database (the caller closes it).

    Raises:
        ConfigError: The database cannot be reached, holds no audit schema, or a
            newer one than this gateway knows.
    """
    try:
        conn = dsn.connect(timeout=10)
    except psycopg.Error as err:
        raise ConfigError(f"audit database {dsn}: cannot connect: {dsn.why(err)}") from err
    version = schema_version(conn)
    if version == 0:
        conn.close()
        raise ConfigError(f"audit database {dsn}: no audit schema (run a2a-gateway db init)")
    if version > LATEST_VERSION:
        conn.close()
        raise ConfigError(
            f"audit database {dsn}: schema version {version} is newer than this "
            f"gateway knows ({LATEST_VERSION})"
        )
    conn.rollback()
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    return conn


def query_agent_records(dsn: ConnectionSource, wanted: AuditFilter) -> list[AgentRecord]:
    """Records of every agent (or ``wanted.agent``) matching ``wanted``, oldest first.

    Raises:
        ConfigError: The database cannot be read, holds no audit schema or a
            record that cannot be read.
    """
    wanted.check_limit()
    where, params = wanted.clauses("%s")
    if wanted.agent is not None:
        where.append("agent_id = %s")
        params.append(wanted.agent)
    oldest_ms = wanted.oldest_ms()
    if oldest_ms is not None:
        where.append("time_unix_ms >= %s")
        params.append(oldest_ms)
    sql = _SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY time_unix_ms DESC, agent_id, seq DESC"
    if wanted.limit is not None:
        sql += " LIMIT %s"
        params.append(wanted.limit)
    conn = read_connection(dsn)
    try:
        rows = conn.execute(sql, params).fetchall()
    except psycopg.Error as err:
        raise ConfigError(f"audit database {dsn}: cannot read: {dsn.why(err)}") from err
    finally:
        conn.close()
    log = f"audit database {dsn}"
    return [
        AgentRecord(str(row[0]), readable_record(row[1:], log, str(dsn))) for row in reversed(rows)
    ]


def recent_agent_request_ids(
    dsn: ConnectionSource,
    *,
    agent: str,
    since: timedelta,
    limit: int,
    refusals: Collection[str],
) -> Iterator[tuple[str, str, int]]:
    """:func:`gateway.audit.query.recent_request_ids` for one agent's chain in
    PostgreSQL, through a server-side cursor (rows arrive in pages).

    Raises:
        ConfigError: The database cannot be read or holds no audit schema.
    """
    sql = (
        "SELECT peer_id, request_id, time_unix_ms FROM audit_records "
        "WHERE agent_id = %s AND time_unix_ms >= %s "
        "AND (decision = 'allow' OR reason = ANY(%s)) "
        "ORDER BY seq DESC LIMIT %s"
    )
    oldest_ms = int((time.time() - since.total_seconds()) * 1000)
    conn = read_connection(dsn)
    try:
        with conn.transaction(), conn.cursor(name="recent_request_ids") as cursor:
            cursor.itersize = _PAGE_ROWS
            cursor.execute(sql, (agent, oldest_ms, list(refusals), limit))
            for peer_id, request_id, time_unix_ms in cursor:
                yield str(peer_id), str(request_id), int(str(time_unix_ms))
    except psycopg.Error as err:
        raise ConfigError(f"audit database {dsn}: cannot read: {dsn.why(err)}") from err
    finally:
        conn.close()


def verify_agent_chains(dsn: ConnectionSource, agent: str | None = None) -> dict[str, VerifyReport]:
    """Verify the chain of every agent (or only ``agent``); reports by agent id.

    Raises:
        ConfigError: The database cannot be read, or ``agent`` has no chain there.
    """
    conn = read_connection(dsn)
    try:
        with conn.transaction():
            if agent is None:
                heads = conn.execute(
                    "SELECT agent_id, count, last_hash FROM audit_heads ORDER BY agent_id"
                ).fetchall()
                extra = conn.execute(
                    "SELECT DISTINCT agent_id FROM audit_records "
                    "WHERE agent_id NOT IN (SELECT agent_id FROM audit_heads)"
                ).fetchall()
            else:
                heads = conn.execute(
                    "SELECT agent_id, count, last_hash FROM audit_heads WHERE agent_id = %s",
                    (agent,),
                ).fetchall()
                extra = conn.execute(  # records whose head row is gone: tampering, not absence
                    "SELECT DISTINCT agent_id FROM audit_records WHERE agent_id = %s "
                    "AND agent_id NOT IN (SELECT agent_id FROM audit_heads)",
                    (agent,),
                ).fetchall()
            chains: dict[str, tuple[int, str] | None] = {
                str(h[0]): (int(str(h[1])), str(h[2])) for h in heads
            }
            chains.update({str(row[0]): None for row in extra})
            if agent is not None and agent not in chains:
                raise ConfigError(f"audit database {dsn}: no chain for agent {agent}")
            reports = {}
            for agent_id, head in sorted(chains.items()):
                raw = conn.execute(
                    _SELECT_CHAINED + " WHERE agent_id = %s ORDER BY seq", (agent_id,)
                ).fetchall()
                reports[agent_id] = verify_rows(raw, head)
    except psycopg.Error as err:
        raise ConfigError(f"audit database {dsn}: cannot read: {dsn.why(err)}") from err
    finally:
        conn.close()
    return reports


def chain_hashes_at(
    dsn: ConnectionSource, agent: str, seqs: list[int]
) -> tuple[int, dict[int, str]]:
    """The last seq of ``agent``'s chain and its record hashes at ``seqs`` (one snapshot).

    Raises:
        ConfigError: The database cannot be read.
    """
    conn = read_connection(dsn)
    try:
        with conn.transaction():
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM audit_records WHERE agent_id = %s", (agent,)
            ).fetchone()
            found = conn.execute(
                "SELECT seq, record_hash FROM audit_records WHERE agent_id = %s AND seq = ANY(%s)",
                (agent, seqs),
            ).fetchall()
    except psycopg.Error as err:
        raise ConfigError(f"audit database {dsn}: cannot read: {dsn.why(err)}") from err
    finally:
        conn.close()
    last = int(str(row[0])) if row else 0
    return last, {int(str(seq)): str(digest) for seq, digest in found}


class PostgresAuditReader(AuditReader):
    """Reads the shared audit table, one REPEATABLE READ snapshot per call
    (an :class:`~gateway.audit.store.store.AuditReader`)."""

    def __init__(self, dsn: ConnectionSource) -> None:
        """Read the database ``dsn`` reaches (nothing is opened yet)."""
        self._dsn = dsn

    @property
    def many_chains(self) -> bool:
        """True: the table holds one chain per agent id."""
        return True

    def query(self, wanted: AuditFilter) -> list[AuditRecord]:
        """Matching records, ordered by time (see :func:`query_agent_records` for their agents)."""
        return [entry.record for entry in query_agent_records(self._dsn, wanted)]

    def recent_request_ids(
        self, *, agent: str, since: timedelta, limit: int, refusals: Collection[str]
    ) -> Iterator[tuple[str, str, int]]:
        """Through a server-side cursor, newest first."""
        return recent_agent_request_ids(
            self._dsn, agent=agent, since=since, limit=limit, refusals=refusals
        )

    def verify(self, agent: str | None = None) -> VerifyReport:
        """Check ``agent``'s chain (``agent`` may be left out when the table holds one chain).

        Raises:
            ConfigError: The database cannot be read, or holds several chains and
                no ``agent`` was named.
        """
        reports = verify_agent_chains(self._dsn, agent)
        if len(reports) != 1:
            raise ConfigError(f"audit database {self._dsn}: {len(reports)} chains; name one agent")
        return next(iter(reports.values()))

    def hashes_at(self, agent: str, seqs: list[int]) -> tuple[int, dict[int, str]]:
        """See :func:`chain_hashes_at`."""
        return chain_hashes_at(self._dsn, agent, seqs)
