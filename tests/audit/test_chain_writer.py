"""SqliteChainWriter against real SQLite files: big batches, another writer on the same log."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from gateway.audit import query_records, verify_chain
from gateway.audit.record import checked_fields
from gateway.audit.store.sqlite import SqliteChainWriter
from gateway.audit.store.sqlite_schema import ROWS_PER_INSERT
from gateway.errors import AuditUnavailable
from gateway.storage import open_audit_reader
from tests.audit.conftest import RecordFactory


def _writer(path: Path) -> SqliteChainWriter:
    writer = SqliteChainWriter(path, busy_timeout_ms=5000)
    writer.open()
    return writer


@pytest.mark.parametrize(
    "size", [1, ROWS_PER_INSERT - 1, ROWS_PER_INSERT, ROWS_PER_INSERT + 1, 2 * ROWS_PER_INSERT + 6]
)
def test_a_big_batch_is_one_contiguous_chain(
    tmp_path: Path, make_record: RecordFactory, size: int
) -> None:
    # One INSERT stores up to ROWS_PER_INSERT rows: a batch spans several.
    path = tmp_path / "audit.sqlite"
    writer = _writer(path)
    try:
        writer.append([checked_fields(make_record(request_id=f"a-{n}")) for n in range(size)])
        writer.append([checked_fields(make_record(request_id="b-0"))])
    finally:
        writer.close()

    stored = query_records(open_audit_reader(path))
    assert [rec.seq for rec in stored] == list(range(1, size + 2))
    assert [rec.request_id for rec in stored] == [f"a-{n}" for n in range(size)] + ["b-0"]
    assert verify_chain(open_audit_reader(path)).ok
    with closing(sqlite3.connect(path)) as conn:
        head = conn.execute("SELECT count, last_hash FROM chain_head").fetchone()
        last = conn.execute("SELECT seq, record_hash FROM audit_records WHERE seq = ?", (size + 1,))
        assert head == last.fetchone()


def test_a_writer_chains_onto_records_another_writer_added(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    path = tmp_path / "audit.sqlite"
    agent, operator = _writer(path), _writer(path)
    try:
        agent.append([checked_fields(make_record(request_id="agent-1"))])
        operator.append([checked_fields(make_record(request_id=f"op-{n}")) for n in range(2)])
        agent.append([checked_fields(make_record(request_id="agent-2"))])
    finally:
        agent.close()
        operator.close()

    stored = query_records(open_audit_reader(path))
    assert [(rec.seq, rec.request_id) for rec in stored] == [
        (1, "agent-1"),
        (2, "op-0"),
        (3, "op-1"),
        (4, "agent-2"),
    ]
    assert verify_chain(open_audit_reader(path)).ok


def test_a_missing_chain_head_fails_the_append_and_stores_nothing(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    path = tmp_path / "audit.sqlite"
    writer = _writer(path)
    try:
        writer.append([checked_fields(make_record(request_id="before"))])
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM chain_head")
        with pytest.raises(AuditUnavailable, match="chain_head row is missing"):
            writer.append([checked_fields(make_record(request_id="after"))])
        with closing(sqlite3.connect(path)) as conn:
            stored = conn.execute("SELECT seq, record_hash FROM audit_records").fetchall()
        assert [(writer.count, writer.last_hash)] == stored
    finally:
        writer.close()

    assert [rec.request_id for rec in query_records(open_audit_reader(path))] == ["before"]
