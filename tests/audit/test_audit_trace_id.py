"""Audit logs of schema versions 1 (no trace_id) and 2 (no user columns) are read as they are
and migrated on open."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from gateway.audit import AuditLog, AuditRecord, query_records, verify_chain
from gateway.storage import open_audit_reader, open_chain_writer

RecordFactory = Callable[..., AuditRecord]


async def _version_1_log(path: Path, make_record: RecordFactory) -> None:
    log = AuditLog(open_chain_writer(path))
    await log.start()
    for _ in range(3):
        await log.record_durable(make_record())
    await log.close()
    with closing(sqlite3.connect(path)) as conn, conn:
        for column in ("trace_id", "on_behalf_of", "actor_chain"):
            conn.execute(f"ALTER TABLE audit_records DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 1")


async def test_a_version_1_log_reads_and_verifies_without_migration(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    path = tmp_path / "old.db"
    await _version_1_log(path, make_record)

    assert [r.trace_id for r in query_records(open_audit_reader(path))] == ["", "", ""]
    report = verify_chain(open_audit_reader(path))
    assert report.ok and report.records == 3
    with closing(sqlite3.connect(path)) as conn:  # reading changed nothing on disk
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


async def test_opening_a_version_1_log_migrates_it_and_keeps_the_chain(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    path = tmp_path / "old.db"
    await _version_1_log(path, make_record)

    log = AuditLog(open_chain_writer(path))
    await log.start()
    await log.record_durable(make_record(trace_id="0af7651916cd43dd8448eb211c80319c"))
    await log.close()

    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert [r.trace_id for r in query_records(open_audit_reader(path))] == [
        "",
        "",
        "",
        "0af7651916cd43dd8448eb211c80319c",
    ]
    report = verify_chain(open_audit_reader(path))
    assert report.ok and report.records == 4


async def test_opening_a_version_2_log_migrates_it_and_a_user_record_chains_on(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    path = tmp_path / "v2.db"
    log = AuditLog(open_chain_writer(path))
    await log.start()
    for _ in range(2):
        await log.record_durable(make_record(trace_id="0af7651916cd43dd8448eb211c80319c"))
    await log.close()
    with closing(sqlite3.connect(path)) as conn, conn:
        for column in ("on_behalf_of", "actor_chain"):
            conn.execute(f"ALTER TABLE audit_records DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 2")
    assert verify_chain(open_audit_reader(path)).ok  # read as it is, unmigrated

    log = AuditLog(open_chain_writer(path))
    await log.start()
    await log.record_durable(make_record(on_behalf_of="user-7", actor_chain='["x"]'))
    await log.close()

    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    rows = query_records(open_audit_reader(path))
    assert [(r.on_behalf_of, r.actor_chain) for r in rows] == [
        ("", ""),
        ("", ""),
        ("user-7", '["x"]'),
    ]
    report = verify_chain(open_audit_reader(path))
    assert report.ok and report.records == 3
