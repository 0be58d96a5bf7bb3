"""verify_chain names each kind of tampering, at the right seq (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.audit import AuditLog, AuditRecord, Decision, query_records, verify_chain
from gateway.audit.chain import GENESIS_HASH, record_hash
from gateway.errors import ConfigError
from gateway.storage import location, open_audit_reader, open_chain_writer
from tests.audit.conftest import AGENT
from tests.postgres import PostgresCluster

RecordFactory = Callable[..., AuditRecord]
RECORDS = 10
Found = list[tuple[str, int]]


@pytest.fixture(scope="module")
async def pristine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Path]:
    """A closed log of RECORDS records, to be copied by each test."""
    path = tmp_path_factory.mktemp("pristine") / "audit.db"
    log = AuditLog(open_chain_writer(path))
    await log.start()
    for n in range(1, RECORDS + 1):
        decision: Decision = "refuse" if n % 3 == 0 else "allow"
        log.record(
            AuditRecord(
                time_unix_ms=1_700_000_000_000 + n,
                request_id=f"req-{n}",
                peer_id="spiffe://example.org/agent/bob",
                capability="translate",
                version_constraint="~2.1",
                served_version="2.1.4",
                decision=decision,
                reason="OK" if decision == "allow" else "RISK_NOT_GRANTED",
                payload_size=n * 10,
                payload_sha256=f"{n:064x}",
                latency_ms=n / 4,
                trace_id=f"{n:032x}" if n % 2 == 0 else "",
            )
        )
    await log.close()
    yield path


@pytest.fixture
def sqlite_copy(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"
    shutil.copyfile(pristine, path)
    return path


@pytest.fixture(scope="module")
async def pristine_pg(postgres_cluster: PostgresCluster, pristine: Path) -> str:
    """The same records in a PostgreSQL database, used as a template by each test."""
    dsn = postgres_cluster.fresh_database()
    log = AuditLog(open_chain_writer(location(dsn), agent_id=AGENT))
    await log.start()
    for rec in query_records(open_audit_reader(pristine)):
        log.record(dataclasses.replace(rec, seq=0))
    await log.close()
    return dsn.rsplit("/", 1)[1]


@pytest.fixture(params=["sqlite", "postgres"])
def log_copy(request: pytest.FixtureRequest, sqlite_copy: Path) -> Path:
    """A fresh copy of the pristine log in each backend (typed Path: both read the same)."""
    if request.param == "sqlite":
        return sqlite_copy
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    template = request.getfixturevalue("pristine_pg")
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return location(cluster.dsn(name))  # type: ignore[return-value]


class _PostgresTampering:
    """The SQLite tampering statements, run against the shared PostgreSQL table.

    Only what differs is rewritten: placeholders, the head table's name, and
    the ``agent_id`` column a row of the shared table needs.
    """

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor[tuple[Any, ...]]:
        sql = sql.replace("chain_head", "audit_heads").replace("?", "%s")
        sql = re.sub(r":(\w+)", r"%(\1)s", sql)
        sql = sql.replace("SELECT 42,", "SELECT agent_id, 42,")
        sql = sql.replace("INSERT INTO audit_records (", "INSERT INTO audit_records (agent_id, ")
        if isinstance(params, dict):
            sql = sql.replace("VALUES (", "VALUES (%(agent_id)s, ")
            params = {**params, "agent_id": AGENT}
        return self._conn.execute(sql, params)  # type: ignore[arg-type]


@contextmanager
def tampering(path: Path) -> Iterator[Any]:
    if not isinstance(path, Path):
        with psycopg.connect(path.url) as conn:
            yield _PostgresTampering(conn)
        return
    with closing(sqlite3.connect(path)) as conn, conn:
        yield conn


def found(path: Path) -> Found:
    return [
        (problem.kind, problem.seq) for problem in verify_chain(open_audit_reader(path)).problems
    ]


def hash_of(conn: Any, seq: int) -> str:
    if seq == 0:
        return GENESIS_HASH
    return str(
        conn.execute("SELECT record_hash FROM audit_records WHERE seq = ?", (seq,)).fetchone()[0]
    )


def insert_row(conn: Any, rec: AuditRecord, prev_hash: str, digest: str) -> None:
    values = {**rec.to_json_dict(), "prev_hash": prev_hash, "record_hash": digest}
    names = ", ".join(values)
    marks = ", ".join(f":{name}" for name in values)
    conn.execute(f"INSERT INTO audit_records ({names}) VALUES ({marks})", values)


def forged(path: Path, seq: int) -> AuditRecord:
    original = query_records(open_audit_reader(path))[0]
    return dataclasses.replace(original, request_id="forged", reason="OK", seq=seq)


def shift_up_from(conn: Any, seq: int) -> None:
    conn.execute("UPDATE audit_records SET seq = -seq WHERE seq >= ?", (seq,))
    conn.execute("UPDATE audit_records SET seq = 1 - seq WHERE seq < 0")


def swap(conn: Any, a: int, b: int) -> None:
    conn.execute("UPDATE audit_records SET seq = -1 WHERE seq = ?", (a,))
    conn.execute("UPDATE audit_records SET seq = ? WHERE seq = ?", (a, b))
    conn.execute("UPDATE audit_records SET seq = ? WHERE seq = -1", (b,))


def test_untampered_log_verifies(log_copy: Path) -> None:
    report = verify_chain(open_audit_reader(log_copy))

    assert report.ok
    assert report.records == RECORDS
    assert report.problems == ()


async def test_empty_log_verifies(db_path: Path) -> None:
    log = AuditLog(open_chain_writer(db_path))
    await log.start()
    await log.close()

    assert verify_chain(open_audit_reader(db_path)) == verify_chain(open_audit_reader(db_path))
    assert verify_chain(open_audit_reader(db_path)).ok


async def test_log_in_use_verifies(
    audit_log: AuditLog, db_path: Path, make_record: RecordFactory
) -> None:
    for _ in range(5):
        await audit_log.record_durable(make_record())

    assert verify_chain(open_audit_reader(db_path)).records == 5
    assert verify_chain(open_audit_reader(db_path)).ok


@pytest.mark.parametrize("seq", range(1, RECORDS + 1))
def test_modified_field(log_copy: Path, seq: int) -> None:
    # Records were written with latency seq / 4; 1000.5 is none of them.
    with tampering(log_copy) as conn:
        conn.execute("UPDATE audit_records SET latency_ms = 1000.5 WHERE seq = ?", (seq,))

    assert found(log_copy) == [("modified", seq)]


@pytest.mark.parametrize("seq", range(1, RECORDS + 1))
def test_modified_trace_id(log_copy: Path, seq: int) -> None:
    # Even seqs carry a trace id (changed here), odd ones none (one is set here).
    with tampering(log_copy) as conn:
        conn.execute("UPDATE audit_records SET trace_id = ? WHERE seq = ?", ("f" * 32, seq))

    assert found(log_copy) == [("modified", seq)]


@pytest.mark.parametrize("seq", range(2, RECORDS + 1, 2))
def test_cleared_trace_id(log_copy: Path, seq: int) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE audit_records SET trace_id = '' WHERE seq = ?", (seq,))

    assert found(log_copy) == [("modified", seq)]


@pytest.mark.parametrize("seq", range(1, RECORDS + 1))
def test_modified_and_rehashed(log_copy: Path, seq: int) -> None:
    record = dataclasses.replace(
        query_records(open_audit_reader(log_copy))[seq - 1], peer_id="spiffe://evil"
    )
    with tampering(log_copy) as conn:
        digest = record_hash(hash_of(conn, seq - 1), record)
        conn.execute(
            "UPDATE audit_records SET peer_id = ?, record_hash = ? WHERE seq = ?",
            (record.peer_id, digest, seq),
        )

    assert found(log_copy) == [("modified", seq)]


@pytest.mark.parametrize("seq", range(1, RECORDS))
def test_deleted_middle_row(log_copy: Path, seq: int) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM audit_records WHERE seq = ?", (seq,))

    assert found(log_copy) == [("deleted", seq)]


def test_deleted_run_is_one_problem(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM audit_records WHERE seq BETWEEN 4 AND 6")

    report = verify_chain(open_audit_reader(log_copy))
    assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 4)]
    assert "4..6" in report.problems[0].message


@pytest.mark.parametrize("fix_head_count", [False, True])
@pytest.mark.parametrize("seq", [1, 5, RECORDS - 1])
def test_deleted_and_gap_closed_by_renumbering(
    log_copy: Path, seq: int, fix_head_count: bool
) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM audit_records WHERE seq = ?", (seq,))
        conn.execute("UPDATE audit_records SET seq = -seq WHERE seq > ?", (seq,))
        conn.execute("UPDATE audit_records SET seq = -seq - 1 WHERE seq < 0")
        if fix_head_count:
            conn.execute("UPDATE chain_head SET count = count - 1")

    assert found(log_copy) == [("deleted", seq)]


@pytest.mark.parametrize("seq", range(1, RECORDS + 1))
def test_inserted_by_shifting_seqs(log_copy: Path, seq: int) -> None:
    with tampering(log_copy) as conn:
        shift_up_from(conn, seq)
        insert_row(conn, forged(log_copy, seq), "f" * 64, "e" * 64)

    assert found(log_copy) == [("inserted", seq)]


@pytest.mark.parametrize("seq", range(1, RECORDS + 1))
def test_inserted_with_valid_hash_by_shifting_seqs(log_copy: Path, seq: int) -> None:
    record = forged(log_copy, seq)
    with tampering(log_copy) as conn:
        prev = hash_of(conn, seq - 1)
        shift_up_from(conn, seq)
        insert_row(conn, record, prev, record_hash(prev, record))

    assert found(log_copy) == [("inserted", seq)]


@pytest.mark.parametrize("valid_hash", [False, True])
def test_inserted_after_the_last_record(log_copy: Path, valid_hash: bool) -> None:
    seq = RECORDS + 1
    record = forged(log_copy, seq)
    with tampering(log_copy) as conn:
        prev = hash_of(conn, RECORDS)
        digest = record_hash(prev, record) if valid_hash else "e" * 64
        insert_row(conn, record, prev, digest)

    assert found(log_copy) == [("inserted", seq)]


def test_copied_row_is_inserted(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute(
            "INSERT INTO audit_records SELECT 42, time_unix_ms, request_id, task_id, step_id,"
            " peer_id, capability, version_constraint, served_version, decision, reason,"
            " detail, payload_size, payload_sha256, latency_ms, prev_hash, record_hash, trace_id,"
            " on_behalf_of, actor_chain"
            " FROM audit_records WHERE seq = 4"
        )

    assert found(log_copy) == [("inserted", 42)]


@pytest.mark.parametrize(("a", "b"), [(1, 2), (3, 7), (4, 5), (1, RECORDS), (RECORDS - 1, RECORDS)])
def test_swapped_rows_are_reordered(log_copy: Path, a: int, b: int) -> None:
    with tampering(log_copy) as conn:
        swap(conn, a, b)

    assert found(log_copy) == [("reordered", a), ("reordered", b)]


def test_rotated_rows_are_reordered(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE audit_records SET seq = -seq WHERE seq IN (2, 3, 4)")
        conn.execute(
            "UPDATE audit_records SET seq = CASE seq WHEN -4 THEN 2 ELSE -seq + 1 END WHERE seq < 0"
        )

    assert found(log_copy) == [("reordered", 2), ("reordered", 3), ("reordered", 4)]


def test_renumbered_row_is_reordered(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE audit_records SET seq = 99 WHERE seq = 5")

    report = verify_chain(open_audit_reader(log_copy))
    assert [(p.kind, p.seq) for p in report.problems] == [("reordered", 99)]
    assert "written as 5" in report.problems[0].message


@pytest.mark.parametrize("first_missing", range(1, RECORDS + 1))
def test_truncated_tail(log_copy: Path, first_missing: int) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM audit_records WHERE seq >= ?", (first_missing,))

    assert found(log_copy) == [("truncated", first_missing)]


def test_missing_chain_head_is_reported(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM chain_head")

    assert found(log_copy) == [("truncated", RECORDS + 1)]


def test_two_tamperings_are_both_reported(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE audit_records SET capability = 'admin' WHERE seq = 2")
        conn.execute("DELETE FROM audit_records WHERE seq = 6")

    assert found(log_copy) == [("modified", 2), ("deleted", 6)]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        verify_chain(open_audit_reader(tmp_path / "nope.db"))


def test_other_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")

    with pytest.raises(ConfigError, match="not an audit log"):
        verify_chain(open_audit_reader(path))


def test_verify_does_not_write(sqlite_copy: Path) -> None:
    before = sqlite_copy.read_bytes()

    verify_chain(open_audit_reader(sqlite_copy))

    assert sqlite_copy.read_bytes() == before


async def test_verify_while_appending_sees_a_consistent_snapshot(
    db_path: Path, make_record: RecordFactory
) -> None:
    log = AuditLog(open_chain_writer(db_path), max_batch=5)
    await log.start()

    async def append() -> None:
        for _ in range(20):
            await asyncio.gather(*(log.record_durable(make_record()) for _ in range(10)))

    writer = asyncio.create_task(append())
    reports = []
    while not writer.done():
        reports.append(await asyncio.to_thread(verify_chain, open_audit_reader(db_path)))
    await writer
    await log.close()

    assert reports
    assert all(report.ok for report in reports), [r.problems for r in reports if not r.ok]
    assert verify_chain(open_audit_reader(db_path)).records == 200
