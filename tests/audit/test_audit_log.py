"""AuditLog against real SQLite files: durability, batching, failing closed."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from gateway.audit import AuditLog, AuditRecord, query_records, verify_chain
from gateway.errors import AuditUnavailable, ConfigError
from gateway.postgres.dsn import StoreLocation
from gateway.storage import open_audit_reader, open_chain_writer
from tests.audit.conftest import AGENT

RecordFactory = Callable[..., AuditRecord]


def _stored_seqs(path: Path) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM audit_records ORDER BY seq")]


async def test_records_round_trip_with_exact_values(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    audit_log = AuditLog(open_chain_writer(any_db, agent_id=AGENT))
    await audit_log.start()
    written = [
        make_record(),
        make_record(
            decision="refuse",
            reason="CAPABILITY_NOT_GRANTED",
            detail="capability not registered",
            served_version="",
            peer_id="",
            task_id="task-9",
            step_id="step-2",
            latency_ms=0.125,
        ),
        make_record(payload_size=0, request_id="ünïcode-id"),
    ]
    for rec in written:
        audit_log.record(rec)
    await audit_log.close()

    stored = query_records(open_audit_reader(any_db))

    assert stored == [dataclasses.replace(rec, seq=i) for i, rec in enumerate(written, 1)]


async def test_record_durable_is_visible_to_another_connection(
    audit_log: AuditLog, db_path: Path, make_record: RecordFactory
) -> None:
    rec = make_record(decision="refuse", reason="UNKNOWN_PEER", request_id="durable-1")

    await audit_log.record_durable(rec)

    with closing(sqlite3.connect(db_path)) as other:
        rows = other.execute("SELECT seq, request_id, reason FROM audit_records").fetchall()
    assert rows == [(1, "durable-1", "UNKNOWN_PEER")]


async def test_log_uses_wal_journal(audit_log: AuditLog, db_path: Path) -> None:
    with closing(sqlite3.connect(db_path)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_concurrent_durable_records_share_commits(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    log = AuditLog(open_chain_writer(any_db, agent_id=AGENT))
    await log.start()
    records = [make_record(decision="refuse", reason="UNKNOWN_PEER") for _ in range(1000)]

    await asyncio.gather(*(log.record_durable(rec) for rec in records))
    await log.close()

    assert 0 < log.batches_committed < 1000
    assert [r.seq for r in query_records(open_audit_reader(any_db))] == list(range(1, 1001))
    assert verify_chain(open_audit_reader(any_db)).ok
    assert [r.request_id for r in query_records(open_audit_reader(any_db))] == [
        r.request_id for r in records
    ]


async def test_batches_respect_max_batch(any_db: StoreLocation, make_record: RecordFactory) -> None:
    log = AuditLog(open_chain_writer(any_db, agent_id=AGENT), max_batch=10)
    await log.start()

    await asyncio.gather(*(log.record_durable(make_record()) for _ in range(100)))
    await log.close()

    assert log.batches_committed >= 10
    assert verify_chain(open_audit_reader(any_db)).records == 100


async def test_reopening_continues_the_chain(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    for _ in range(2):
        log = AuditLog(open_chain_writer(any_db, agent_id=AGENT))
        await log.start()
        for _ in range(3):
            log.record(make_record())
        await log.close()

    assert [r.seq for r in query_records(open_audit_reader(any_db))] == [1, 2, 3, 4, 5, 6]
    assert verify_chain(open_audit_reader(any_db)).ok


async def test_close_commits_fire_and_forget_records(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    log = AuditLog(open_chain_writer(any_db, agent_id=AGENT))
    await log.start()
    for _ in range(50):
        log.record(make_record())

    await log.close()

    assert len(query_records(open_audit_reader(any_db))) == 50


async def test_commit_failure_fails_closed(db_path: Path, make_record: RecordFactory) -> None:
    log = AuditLog(open_chain_writer(db_path, busy_timeout_ms=50))
    await log.start()
    await log.record_durable(make_record())
    with closing(sqlite3.connect(db_path, isolation_level=None)) as blocker:
        blocker.execute("BEGIN EXCLUSIVE")  # holds the write lock past the busy timeout

        results = await asyncio.gather(
            *(log.record_durable(make_record(decision="refuse")) for _ in range(20)),
            return_exceptions=True,
        )

        blocker.execute("ROLLBACK")
    assert all(isinstance(result, AuditUnavailable) for result in results)
    assert "locked" in str(results[0])
    assert isinstance(results[0], AuditUnavailable)
    assert isinstance(results[0].__cause__, sqlite3.OperationalError)
    assert log.healthy is False
    with pytest.raises(AuditUnavailable, match="locked"):
        log.record(make_record())
    with pytest.raises(AuditUnavailable):
        await log.record_durable(make_record())
    with pytest.raises(AuditUnavailable):
        await log.flush()
    await log.close()
    assert _stored_seqs(db_path) == [1]


@pytest.mark.parametrize("retry_seconds", [None, 0.05])
async def test_records_of_answered_calls_survive_a_failed_commit(
    db_path: Path, make_record: RecordFactory, retry_seconds: float | None
) -> None:
    """Plain records (their calls went ahead) are kept and written once the file is
    writable: on recovery, or at the latest when the log closes; never twice. A
    refusal whose caller was told AUDIT_UNAVAILABLE is not written later."""
    log = AuditLog(open_chain_writer(db_path, busy_timeout_ms=500), retry_seconds=retry_seconds)
    await log.start()
    plain = [make_record() for _ in range(3)]
    with closing(sqlite3.connect(db_path, isolation_level=None)) as blocker:
        blocker.execute("BEGIN EXCLUSIVE")
        for rec in plain:  # queued at once, long before the lock wait ends
            log.record(rec)
        with pytest.raises(AuditUnavailable, match="locked"):
            await log.record_durable(make_record(decision="refuse", request_id="told"))
        assert not log.healthy
        blocker.execute("ROLLBACK")
    if retry_seconds is not None:
        for _ in range(100):  # bounded: 10 s
            if log.healthy:
                break
            await asyncio.sleep(0.1)
        assert log.healthy
    await log.close()
    assert [r.request_id for r in query_records(open_audit_reader(db_path))] == [
        r.request_id for r in plain
    ]
    assert verify_chain(open_audit_reader(db_path)).ok


async def test_malformed_record_is_refused_without_failing_the_log(
    audit_log: AuditLog, make_record: RecordFactory
) -> None:
    with pytest.raises(AuditUnavailable, match="malformed"):
        await audit_log.record_durable(make_record(decision="deny"))

    assert audit_log.healthy
    await audit_log.record_durable(make_record())


@pytest.mark.parametrize("kind", ["directory", "missing parent", "not a database"])
async def test_unopenable_file_raises_audit_unavailable(
    tmp_path: Path, kind: str, make_record: RecordFactory
) -> None:
    path = {
        "directory": tmp_path,
        "missing parent": tmp_path / "no" / "such" / "audit.db",
        "not a database": tmp_path / "garbage.db",
    }[kind]
    if kind == "not a database":
        path.write_bytes(b"this is not sqlite" * 100)
    log = AuditLog(open_chain_writer(path))

    with pytest.raises(AuditUnavailable) as caught:
        await log.start()

    assert str(path) in caught.value.message
    assert caught.value.__cause__ is not None
    assert log.healthy is False
    with pytest.raises(AuditUnavailable):
        await log.record_durable(make_record())
    await log.close()


async def test_start_refuses_a_log_whose_head_does_not_match(
    db_path: Path, make_record: RecordFactory
) -> None:
    log = AuditLog(open_chain_writer(db_path))
    await log.start()
    for _ in range(3):
        log.record(make_record())
    await log.close()
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("DELETE FROM audit_records WHERE seq = 3")

    with pytest.raises(AuditUnavailable, match="chain head"):
        await AuditLog(open_chain_writer(db_path)).start()


async def test_lifecycle_guards(db_path: Path, make_record: RecordFactory) -> None:
    log = AuditLog(open_chain_writer(db_path))
    assert log.healthy is False
    with pytest.raises(AuditUnavailable, match="not started"):
        log.record(make_record())
    await log.start()
    assert log.healthy is True
    with pytest.raises(AuditUnavailable, match="already started"):
        await log.start()
    await log.close()
    await log.close()
    await log.flush()  # everything was flushed by close
    assert log.healthy is False
    with pytest.raises(AuditUnavailable, match="closed"):
        log.record(make_record())


@pytest.mark.parametrize(
    ("writer_kwargs", "log_kwargs"), [({}, {"max_batch": 0}), ({"busy_timeout_ms": -1}, {})]
)
def test_bad_settings_raise_config_error(
    db_path: Path, writer_kwargs: dict[str, int], log_kwargs: dict[str, int]
) -> None:
    with pytest.raises(ConfigError):
        AuditLog(open_chain_writer(db_path, **writer_kwargs), **log_kwargs)


async def test_another_writer_may_append_while_the_log_is_open(
    audit_log: AuditLog, db_path: Path, make_record: RecordFactory
) -> None:
    # The operator CLI appends its records to a running agent's log this way.
    from gateway.audit.record import checked_fields
    from gateway.audit.store.sqlite import SqliteChainWriter

    await audit_log.record_durable(make_record(request_id="agent-1"))
    other = SqliteChainWriter(db_path, busy_timeout_ms=5000)
    other.open()
    other.append([checked_fields(make_record(request_id="operator-1"))])
    other.close()
    await audit_log.record_durable(make_record(request_id="agent-2"))
    assert [r.request_id for r in query_records(open_audit_reader(db_path))] == [
        "agent-1",
        "operator-1",
        "agent-2",
    ]
    assert _stored_seqs(db_path) == [1, 2, 3]
    assert verify_chain(open_audit_reader(db_path)).ok


@pytest.mark.parametrize("cut", [1, 2])
async def test_a_head_moved_back_while_open_fails_closed(
    audit_log: AuditLog, db_path: Path, make_record: RecordFactory, cut: int
) -> None:
    for n in range(3):
        await audit_log.record_durable(make_record(request_id=f"r{n}"))
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("DELETE FROM audit_records WHERE seq > ?", (3 - cut,))
        row = conn.execute("SELECT seq, record_hash FROM audit_records WHERE seq = ?", (3 - cut,))
        conn.execute("UPDATE chain_head SET count = ?, last_hash = ? WHERE id = 1", row.fetchone())
    with pytest.raises(AuditUnavailable, match="chain head moved back from seq 3"):
        await audit_log.record_durable(make_record(request_id="after"))
    assert not audit_log.healthy
    assert _stored_seqs(db_path) == list(range(1, 4 - cut))
