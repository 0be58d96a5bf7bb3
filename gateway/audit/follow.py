"""Follow an audit log: the records that commit after a starting point, as they commit.

A feed remembers the highest ``seq`` it has handed out (per agent in
PostgreSQL, where each agent has its own chain) and asks the store for
anything above it. Within one chain ``seq`` is assigned under the writer's
lock and committed in order, so "above the last seq seen" never skips a
record that commits later with a lower number. Readers never block the
writer: SQLite reads in WAL mode, PostgreSQL in a read-only transaction per
poll.

Used by ``a2a-gateway audit --follow`` and by the console's live decisions.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from pathlib import Path

import psycopg

from gateway.audit.filter import AuditFilter
from gateway.audit.store.postgres import AgentRecord, read_connection
from gateway.audit.store.sqlite_schema import (
    RECORD_COLUMNS,
    SELECT_RECORDS,
    connect_read_only,
    readable_record,
)
from gateway.errors import ConfigError
from gateway.postgres.source import ConnectionSource

_BATCH_ROWS = 1000


class AuditFeed(ABC):
    """New records of one audit store, oldest first, one batch per :meth:`poll`."""

    @abstractmethod
    def poll(self, most: int | None = None) -> list[AgentRecord]:
        """Records committed since the last poll that match the filter (may be empty);
        with ``most``, about that many at most (whole batches), the rest left for the next.
        A record that cannot be read ends the batch: those before it are handed out, and
        the next poll raises at it.

        Raises:
            ConfigError: The store cannot be read, or holds a record that
                cannot be read.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the connection (idempotent)."""


class SqliteAuditFeed(AuditFeed):
    """Follows one SQLite audit file (one agent; ``agent_id`` is given by the caller)."""

    def __init__(
        self,
        path: Path,
        where: AuditFilter,
        *,
        agent_id: str = "",
        after_seq: int | None = None,
    ) -> None:
        """Open ``path`` read-only; start after its current last record, or
        ``where.since`` ago if given (then the records of that window come first),
        or after record ``after_seq`` if given.

        Raises:
            ConfigError: The file is missing or not an audit log.
        """
        _no_limit(where)
        self._path, self._agent = path, agent_id
        self._conn: sqlite3.Connection | None = connect_read_only(path)
        clauses, self._params = where.clauses("?")
        self._min_ms = where.oldest_ms() or 0
        if where.since is not None:
            clauses.append(f"time_unix_ms >= {self._min_ms}")
        self._sql = (
            SELECT_RECORDS
            + " WHERE seq > ?"
            + "".join(f" AND {c}" for c in clauses)
            + f" ORDER BY seq LIMIT {_BATCH_ROWS}"
        )
        if after_seq is not None:
            self._last = after_seq
        else:
            self._last = 0 if where.since is not None else self._max_seq()

    def _max_seq(self) -> int:
        row = self._read("SELECT COALESCE(MAX(seq), 0) FROM audit_records", ())
        return int(str(row[0][0]))

    def _read(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        if self._conn is None:
            raise ConfigError(f"audit log {self._path}: feed closed")
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise ConfigError(f"audit log {self._path}: cannot read: {err}") from err

    def poll(self, most: int | None = None) -> list[AgentRecord]:
        """Records above the last seq handed out (see :meth:`AuditFeed.poll`)."""
        found: list[AgentRecord] = []
        while True:
            rows = self._read(self._sql, (self._last, *self._params))
            for row in rows:
                try:
                    record = readable_record(row, f"audit log {self._path}", str(self._path))
                except ConfigError:
                    if found:  # those before the bad row first; the next poll stops at it
                        return found
                    raise
                self._last = max(self._last, record.seq)
                found.append(AgentRecord(self._agent, record))
            if len(rows) < _BATCH_ROWS or (most is not None and len(found) >= most):
                return found

    def close(self) -> None:
        """Close the read-only connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresAuditFeed(AuditFeed):
    """Follows the shared PostgreSQL table: every agent's chain (or one, by filter)."""

    def __init__(
        self, dsn: ConnectionSource, where: AuditFilter, *, after_seq: int | None = None
    ) -> None:
        """Connect; start after each chain's current last record, or ``where.since`` ago,
        or after record ``after_seq`` of the chain of ``where.agent`` (required then).

        Raises:
            ConfigError: The database cannot be read or holds no audit schema.
        """
        _no_limit(where)
        self._dsn = dsn
        self._conn: psycopg.Connection[tuple[object, ...]] | None = read_connection(dsn)
        clauses, self._params = where.clauses("%s")
        if where.agent is not None:
            clauses.append("a.agent_id = %s")
            self._params.append(where.agent)
        min_ms = where.oldest_ms()
        if min_ms is not None:
            clauses.append(f"time_unix_ms >= {min_ms}")
        columns = ", ".join(f"a.{c}" for c in RECORD_COLUMNS)
        self._sql = (
            f"SELECT a.agent_id, {columns} FROM audit_records a "
            "LEFT JOIN unnest(%s::text[], %s::bigint[]) AS m(mark_agent, seen) "
            "ON m.mark_agent = a.agent_id WHERE a.seq > COALESCE(m.seen, 0)"
            + "".join(f" AND {c}" for c in clauses)
            + f" ORDER BY a.agent_id, a.seq LIMIT {_BATCH_ROWS}"
        )
        self._marks: dict[str, int] = {}
        if after_seq is not None:
            if where.agent is None:
                raise ConfigError("an audit feed from a seq follows one agent's chain")
            self._marks = {where.agent: after_seq}
        elif where.since is None:
            rows = self._read("SELECT agent_id, MAX(seq) FROM audit_records GROUP BY agent_id", [])
            self._marks = {str(agent): int(str(seq)) for agent, seq in rows}

    def _read(self, sql: str, params: list[object]) -> list[tuple[object, ...]]:
        if self._conn is None:
            raise ConfigError(f"audit database {self._dsn}: feed closed")
        try:
            with self._conn.transaction():  # one snapshot per poll, then see new commits
                return self._conn.execute(sql, params).fetchall()
        except psycopg.Error as err:
            raise ConfigError(f"audit database {self._dsn}: cannot read: {err}") from err

    def poll(self, most: int | None = None) -> list[AgentRecord]:
        """Records above each chain's last seq handed out (see :meth:`AuditFeed.poll`)."""
        found: list[AgentRecord] = []
        while True:
            agents = list(self._marks)
            marks = [self._marks[agent] for agent in agents]
            rows = self._read(self._sql, [agents, marks, *self._params])
            for row in rows:
                try:
                    where = f"audit database {self._dsn}"
                    record = readable_record(row[1:], where, str(self._dsn))
                except ConfigError:
                    if found:  # those before the bad row first; the next poll stops at it
                        found.sort(key=lambda e: (e.record.time_unix_ms, e.agent_id, e.record.seq))
                        return found
                    raise
                entry = AgentRecord(str(row[0]), record)
                seen = self._marks.get(entry.agent_id, 0)
                self._marks[entry.agent_id] = max(seen, entry.record.seq)
                found.append(entry)
            if len(rows) < _BATCH_ROWS or (most is not None and len(found) >= most):
                found.sort(key=lambda e: (e.record.time_unix_ms, e.agent_id, e.record.seq))
                return found

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _no_limit(where: AuditFilter) -> None:
    """A feed runs until closed: a ``limit`` would silently stop it, so refuse one."""
    if where.limit is not None:
        raise ConfigError("an audit feed takes no limit (it hands out records until closed)")
