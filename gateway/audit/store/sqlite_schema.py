"""The layout of an audit log: the record columns every backend stores (in hashing order,
so :mod:`gateway.audit.chain` builds on it and it sits below the PostgreSQL layer), how a
row reads back as a record, and the SQLite file's schema its writer and readers share."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from gateway.audit.record import AuditRecord, Decision, checked_fields
from gateway.errors import ConfigError

SCHEMA_VERSION = 3
"""1: the first layout. 2: adds ``trace_id``. 3: adds ``on_behalf_of`` and ``actor_chain``
(files of an older version are migrated on open)."""

RECORD_COLUMNS: tuple[str, ...] = (
    "seq",
    "time_unix_ms",
    "request_id",
    "task_id",
    "step_id",
    "peer_id",
    "capability",
    "version_constraint",
    "served_version",
    "decision",
    "reason",
    "detail",
    "payload_size",
    "payload_sha256",
    "latency_ms",
    "trace_id",
    "on_behalf_of",
    "actor_chain",
)
"""Record columns in hashing order (``trace_id``, added in version 2, and the user columns of
version 3 come last, as in the table)."""

CHAIN_COLUMNS: tuple[str, ...] = ("prev_hash", "record_hash")

MIGRATE_1_TO_2 = "ALTER TABLE audit_records ADD COLUMN trace_id TEXT NOT NULL DEFAULT ''"
"""Version 1 → 2. Old records read back ``trace_id = ""``, which hashes as before."""

MIGRATE_2_TO_3 = (
    "ALTER TABLE audit_records ADD COLUMN on_behalf_of TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE audit_records ADD COLUMN actor_chain TEXT NOT NULL DEFAULT ''",
)
"""Version 2 → 3. Old records read back both empty, which hashes as before."""

# STRICT keeps a stored value's type exactly as written, so a value edited into
# another type shows up as a modification instead of being silently coerced.
DDL = """
CREATE TABLE IF NOT EXISTS audit_records (
    seq INTEGER PRIMARY KEY,
    time_unix_ms INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    peer_id TEXT NOT NULL,
    capability TEXT NOT NULL,
    version_constraint TEXT NOT NULL,
    served_version TEXT NOT NULL,
    decision TEXT NOT NULL CHECK (decision IN ('allow', 'refuse')),
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    payload_size INTEGER NOT NULL,
    payload_sha256 TEXT NOT NULL,
    latency_ms REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    record_hash TEXT NOT NULL,
    trace_id TEXT NOT NULL DEFAULT '',
    on_behalf_of TEXT NOT NULL DEFAULT '',
    actor_chain TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX IF NOT EXISTS audit_records_time ON audit_records (time_unix_ms);
CREATE TABLE IF NOT EXISTS chain_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    count INTEGER NOT NULL,
    last_hash TEXT NOT NULL
) STRICT;
"""

ROWS_PER_INSERT = 32
"""Most records one INSERT statement stores (32 x 20 values: within any SQLite's 999)."""

_ROW_VALUES = f"({', '.join('?' * (len(RECORD_COLUMNS) + len(CHAIN_COLUMNS)))})"

INSERT_RECORDS: tuple[str, ...] = tuple(
    f"INSERT INTO audit_records ({', '.join(RECORD_COLUMNS + CHAIN_COLUMNS)}) "
    f"VALUES {', '.join([_ROW_VALUES] * rows)}"
    for rows in range(ROWS_PER_INSERT + 1)
)
"""``INSERT_RECORDS[n]`` stores ``n`` rows (1 to ``ROWS_PER_INSERT``) given as one flat
sequence of values, row after row (``[0]`` is unused)."""

SELECT_RECORDS = f"SELECT {', '.join(RECORD_COLUMNS)} FROM audit_records"

SELECT_CHAINED = f"SELECT {', '.join(RECORD_COLUMNS + CHAIN_COLUMNS)} FROM audit_records"


def record_from_row(row: Sequence[Any]) -> AuditRecord:
    """An AuditRecord from the first ``len(RECORD_COLUMNS)`` values of a row.

    Values are taken as stored, without coercion, so a tampered value hashes
    differently from the original.
    """
    fields = dict(zip(RECORD_COLUMNS, row, strict=False))
    fields["decision"] = cast(Decision, fields["decision"])
    return AuditRecord(**fields)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
TIME_RANGE_MS = (
    (datetime.min.replace(tzinfo=UTC) - _EPOCH) // _MS,
    (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _MS,
)
"""The ``time_unix_ms`` a record may hold: the years 1 to 9999, all a datetime can show."""


def readable_record(row: Sequence[Any], log: str, db: str) -> AuditRecord:
    """:func:`record_from_row` for a reader that shows or re-decides records.

    The chain check reads rows as stored, whatever they hold; a reader that
    formats, sorts or re-decides them needs each value of its declared type
    and a time a datetime can hold. ``log`` names the store in the message
    (``audit log PATH``), ``db`` is its ``--db`` argument.

    Raises:
        ConfigError: The row is not a record this gateway could have written
            (the store was altered: ``audit verify`` names how).
    """
    rec = record_from_row(row)
    try:
        values = checked_fields(rec)
        time_unix_ms = values["time_unix_ms"]
        if not TIME_RANGE_MS[0] <= cast(int, time_unix_ms) <= TIME_RANGE_MS[1]:
            raise ValueError(f"time_unix_ms {time_unix_ms} is out of range")
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{log}: holds a record that cannot be read (seq {rec.seq}: {err}); "
            f"check the log with: a2a-gateway audit verify --db {db}"
        ) from err
    return record_from_row([values[name] for name in RECORD_COLUMNS])


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to an existing audit database.

    Raises:
        ConfigError: The file does not exist, cannot be opened, or is not an
            audit log.
    """
    if not path.is_file():
        raise ConfigError(f"audit log {path}: no such file")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as err:
        raise ConfigError(f"audit log {path}: cannot open: {err}") from err
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as err:
        conn.close()
        raise ConfigError(f"audit log {path}: cannot read: {err}") from err
    if not {"audit_records", "chain_head"} <= names:
        conn.close()
        raise ConfigError(f"audit log {path}: not an audit log (tables missing)")
    columns = {row[1] for row in conn.execute("PRAGMA table_info(audit_records)")}
    missing = [name for name in _ADDED_COLUMNS if name not in columns]
    if missing:
        # A file of an older version no agent has opened since: read it as migrated
        # (a temp view shadows the table for this connection only).
        added = ", ".join(f"'' AS {name}" for name in missing)
        conn.execute(f"CREATE TEMP VIEW audit_records AS SELECT *, {added} FROM main.audit_records")
    return conn


_ADDED_COLUMNS = ("trace_id", "on_behalf_of", "actor_chain")
"""Columns later versions added, in order (older files read them as "")."""
