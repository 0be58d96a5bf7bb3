"""Tamperings an audit probe found verify_chain mishandling (SQLite and PostgreSQL).

A row moved to a huge seq made the verifier list every seq below it (it ran
out of memory instead of answering), and a chain head whose count disagreed
with its own hash was taken at its hash alone: a cut tail with a rewritten
hash, or an edited count, verified as intact while the writer refused to open
the log. A checkpoint line nested deeper than ``json`` reads crashed
``audit verify`` (RecursionError, exit 70) and the console's audit page,
instead of being named unreadable. Messages about a failed SQLite log named
it "audit log audit log PATH".
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from gateway.config import AgentConfig
from gateway.console.status_views import _last_checkpoint
from gateway.errors import AuditUnavailable
from gateway.storage import open_chain_writer
from tests.helpers.audit_logs import (
    RECORDS,
    RecordFactory,
    checkpoint_problems,
    found,
    hash_of,
    tampering,
)

HUGE = 2**62


def test_a_row_moved_to_a_huge_seq_without_a_head_is_named(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM chain_head")
        conn.execute(
            "UPDATE audit_records SET seq = ?, request_id = 'x' WHERE seq = ?", (HUGE, RECORDS)
        )

    assert found(log_copy) == [
        ("deleted", RECORDS),
        ("modified", HUGE),
        ("truncated", HUGE + 1),
    ]


def test_a_row_moved_under_a_huge_head_count_is_named(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE chain_head SET count = ?", (HUGE,))
        conn.execute(
            "UPDATE audit_records SET seq = ?, request_id = 'x' WHERE seq = ?", (HUGE, RECORDS)
        )

    assert found(log_copy) == [("deleted", RECORDS), ("modified", HUGE)]


def test_a_cut_tail_with_a_rewritten_head_hash_is_truncated(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM audit_records WHERE seq > 7")
        conn.execute("UPDATE chain_head SET last_hash = ?", (hash_of(conn, 7),))

    assert found(log_copy) == [("truncated", 8)]


def test_a_head_count_raised_alone_is_truncated(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE chain_head SET count = ?", (RECORDS + 5,))

    assert found(log_copy) == [("truncated", RECORDS + 1)]


def test_a_head_count_lowered_alone_is_modified(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("UPDATE chain_head SET count = 5")

    assert found(log_copy) == [("modified", RECORDS)]


def test_a_deletion_hidden_by_the_count_alone_names_both(log_copy: Path) -> None:
    with tampering(log_copy) as conn:
        conn.execute("DELETE FROM audit_records WHERE seq = 6")
        conn.execute("UPDATE chain_head SET count = count - 1")

    assert found(log_copy) == [("deleted", 6), ("modified", RECORDS)]


NESTED = "[" * 100_000
"""A line nested far deeper than the json module's recursion limit."""


async def test_a_checkpoint_line_nested_too_deep_is_unreadable(
    alice_log: AgentConfig,
) -> None:
    with alice_log.checkpoint_file.open("a") as handle:
        handle.write(NESTED + "\n")

    assert checkpoint_problems(alice_log) == [("checkpoint_unreadable", 0)]


def test_the_console_passes_over_a_checkpoint_line_nested_too_deep(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite.checkpoints.jsonl"
    line = {"seq": 4, "time_unix_ms": 1_764_540_000_000}
    path.write_text(json.dumps(line) + "\n" + "[" * 5000 + "\n")

    assert _last_checkpoint(path) == (4, 1_764_540_000_000)


async def test_the_recovery_message_names_the_log_once(
    db_path: Path, caplog: pytest.LogCaptureFixture, make_record: RecordFactory
) -> None:
    log = AuditLog(open_chain_writer(db_path, busy_timeout_ms=200), retry_seconds=0.05)
    await log.start()
    record = make_record(decision="refuse", reason="X")
    with caplog.at_level(logging.WARNING, logger="gateway.audit.log"):
        with closing(sqlite3.connect(db_path, isolation_level=None)) as blocker:
            blocker.execute("BEGIN EXCLUSIVE")  # the next commit fails: locked
            with pytest.raises(AuditUnavailable):
                await log.record_durable(record)
            blocker.execute("ROLLBACK")
        for _ in range(100):  # bounded: 10 s
            if log.healthy:
                break
            await asyncio.sleep(0.1)
        await log.close()

    assert f"audit log {db_path}: writable again, accepting records" in caplog.messages
