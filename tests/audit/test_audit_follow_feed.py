"""The audit feed behind ``audit --follow`` and the console: each committed record once, in order."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.audit import AuditLog, AuditRecord
from gateway.audit.filter import AuditFilter
from gateway.errors import ConfigError
from gateway.storage import location, open_audit_feed, open_chain_writer


def _record(
    n: int, *, peer: str = "spiffe://example.org/agent/bob", refused: bool = False
) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"req-{n}",
        peer_id=peer,
        capability="kv.get" if refused else "text.echo",
        version_constraint="",
        served_version="" if refused else "1.0.0",
        decision="refuse" if refused else "allow",
        reason="CAPABILITY_NOT_GRANTED" if refused else "OK",
        payload_size=n,
        payload_sha256="",
        latency_ms=0.1,
    )


async def _write(log: AuditLog, *records: AuditRecord) -> None:
    for rec in records:
        await log.record_durable(rec)


async def test_sqlite_feed_hands_out_each_new_record_once(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(open_chain_writer(db))
    await log.start()
    try:
        await _write(log, _record(1))
        feed = open_audit_feed(db, AuditFilter())
        history = open_audit_feed(db, AuditFilter(refusals_only=True))
        windowed = open_audit_feed(db, AuditFilter(since=timedelta(minutes=5)))
        try:
            assert feed.poll() == [] and history.poll() == []
            assert [e.record.request_id for e in windowed.poll()] == ["req-1"]  # the window first
            await _write(log, _record(2), _record(3, refused=True))
            assert [e.record.request_id for e in feed.poll()] == ["req-2", "req-3"]
            assert feed.poll() == []  # once
            assert [e.record.request_id for e in history.poll()] == ["req-3"]
            assert [e.record.seq for e in windowed.poll()] == [2, 3]
        finally:
            for one in (feed, history, windowed):
                one.close()
    finally:
        await log.close()
    with pytest.raises(ConfigError, match="holds one agent"):
        open_audit_feed(db, AuditFilter(agent="spiffe://example.org/agent/alice"))


async def test_a_row_that_cannot_be_read_ends_the_batch_after_the_rows_before_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(open_chain_writer(db))
    await log.start()
    try:
        feed = open_audit_feed(db, AuditFilter())
        try:
            await _write(log, _record(1), _record(2), _record(3))
            with sqlite3.connect(db) as conn:  # someone altered the log: seq 2 is no record
                conn.execute("UPDATE audit_records SET time_unix_ms = 9e18 WHERE seq = 2")
            # The records before the bad row are handed out, not lost with it.
            assert [e.record.request_id for e in feed.poll()] == ["req-1"]
            for _ in range(2):  # then every poll stops at it, naming the problem
                with pytest.raises(ConfigError, match="audit log"):
                    feed.poll()
        finally:
            feed.close()
    finally:
        await log.close()


async def test_postgres_feed_follows_every_chain_or_one(pg_dsn: str) -> None:
    dsn = location(pg_dsn)
    alice, carol = "spiffe://example.org/agent/alice", "spiffe://example.org/agent/carol"
    logs = {agent: AuditLog(open_chain_writer(dsn, agent_id=agent)) for agent in (alice, carol)}
    for log in logs.values():
        await log.start()
    try:
        await _write(logs[alice], _record(1))
        every = open_audit_feed(dsn, AuditFilter())
        only_carol = open_audit_feed(dsn, AuditFilter(agent=carol))
        try:
            assert every.poll() == [] and only_carol.poll() == []
            await _write(logs[carol], _record(10), _record(11))  # a chain the feed has not seen
            await _write(logs[alice], _record(2, refused=True))
            got = [(e.agent_id, e.record.seq, e.record.request_id) for e in every.poll()]
            assert sorted(got) == [(alice, 2, "req-2"), (carol, 1, "req-10"), (carol, 2, "req-11")]
            assert every.poll() == []
            assert [(e.agent_id, e.record.seq) for e in only_carol.poll()] == [
                (carol, 1),
                (carol, 2),
            ]
            await _write(logs[carol], _record(12))
            assert [(e.agent_id, e.record.seq) for e in every.poll()] == [(carol, 3)]
        finally:
            every.close()
            only_carol.close()
    finally:
        for log in logs.values():
            await log.close()
