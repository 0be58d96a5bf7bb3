"""WalBackfill against real SQLite files: WAL pages reach the database file off the commit path."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from gateway.audit._wal_backfill import BACKSTOP_PAGES, WalBackfill
from gateway.audit._writer import SqliteChainWriter
from gateway.audit.record import checked_fields
from tests.audit.conftest import RecordFactory


def _wal_database(path: Path) -> sqlite3.Connection:
    """A WAL database whose own connection never checkpoints (only the backfill does)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE rows (n INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    return conn


def _commit_rows(conn: sqlite3.Connection, commits: int) -> None:
    for n in range(commits):
        conn.execute("INSERT INTO rows (text) VALUES (?)", ("x" * 3000 + str(n),))


def test_a_due_checkpoint_copies_the_wal_into_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "backfill.sqlite"
    with closing(_wal_database(path)) as conn:
        before = path.stat().st_size
        _commit_rows(conn, 4)
        backfill = WalBackfill(path, synchronous="FULL", every_commits=4)
        backfill.start()
        for _ in range(4):
            backfill.committed()
        backfill.stop()  # after the checkpoint that was due

        # Four rows of 3 KB each, one page each at least, now in the main file.
        assert path.stat().st_size >= before + 4 * 3000
        assert conn.execute("SELECT count(*) FROM rows").fetchone() == (4,)


def test_nothing_is_copied_before_a_checkpoint_is_due(tmp_path: Path) -> None:
    path = tmp_path / "backfill.sqlite"
    with closing(_wal_database(path)) as conn:
        before = path.stat().st_size
        _commit_rows(conn, 3)
        backfill = WalBackfill(path, synchronous="FULL", every_commits=4)
        backfill.start()
        for _ in range(3):
            backfill.committed()
        backfill.stop()

        assert path.stat().st_size == before


def test_a_missing_database_is_never_created(tmp_path: Path) -> None:
    path = tmp_path / "gone.sqlite"
    backfill = WalBackfill(path, synchronous="FULL", every_commits=1)
    backfill.start()
    backfill.committed()
    backfill.stop()

    assert not path.exists()


def test_the_writer_leaves_checkpoints_to_its_backfill(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    path = tmp_path / "audit.sqlite"
    writer = SqliteChainWriter(path, busy_timeout_ms=1000)
    writer.open()
    try:
        assert writer._conn is not None
        pages = writer._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        for _ in range(40):
            writer.append([checked_fields(make_record())])
    finally:
        writer.close()

    assert pages == BACKSTOP_PAGES
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM audit_records").fetchone() == (40,)
