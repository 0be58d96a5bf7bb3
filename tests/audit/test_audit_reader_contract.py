"""The AuditReader contract, run against every backend (SQLite file, PostgreSQL table)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from gateway.audit.filter import AuditFilter
from gateway.audit.record import AuditRecord
from gateway.errors import ConfigError
from gateway.postgres.dsn import StoreLocation
from gateway.storage import location, open_audit_reader, open_chain_writer
from tests.helpers.audit_logs import AGENT, RecordFactory


async def _written(where: StoreLocation, make_record: RecordFactory) -> list[AuditRecord]:
    log = AuditLog(open_chain_writer(where, agent_id=AGENT))
    await log.start()
    records = [
        make_record(request_id="r-1"),
        make_record(request_id="r-2", decision="refuse", reason="UNKNOWN_PEER", peer_id=""),
        make_record(request_id="r-3", decision="refuse", reason="REPLAYED_REQUEST"),
    ]
    for record in records:
        log.record(record)
    await log.close()
    return [dataclasses.replace(record, seq=i) for i, record in enumerate(records, 1)]


async def test_reader_returns_the_chain_in_order_and_filters_it(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    written = await _written(any_db, make_record)
    reader = open_audit_reader(any_db)

    assert reader.many_chains is not isinstance(any_db, Path)
    assert reader.query(AuditFilter(agent=AGENT)) == written
    assert reader.query(AuditFilter(agent=AGENT, refusals_only=True)) == written[1:]
    assert reader.query(AuditFilter(agent=AGENT, limit=1)) == written[2:]
    assert reader.query(AuditFilter(agent=AGENT, peer="")) == [written[1]]


async def test_reader_verifies_the_chain_and_reads_hashes_at_seqs(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    await _written(any_db, make_record)
    reader = open_audit_reader(any_db)

    report = reader.verify(AGENT)
    last, hashes = reader.hashes_at(AGENT, [1, 3, 9])

    assert report.ok and report.records == 3
    assert last == 3
    assert sorted(hashes) == [1, 3]
    assert all(len(value) == 64 for value in hashes.values()) and hashes[1] != hashes[3]


async def test_reader_streams_recent_request_ids_newest_first(
    any_db: StoreLocation, make_record: RecordFactory
) -> None:
    written = await _written(any_db, make_record)
    reader = open_audit_reader(any_db)

    seen = list(
        reader.recent_request_ids(
            agent=AGENT, since=timedelta(hours=1), limit=10, refusals=["UNKNOWN_PEER"]
        )
    )

    assert seen == [(r.peer_id, r.request_id, r.time_unix_ms) for r in (written[1], written[0])]


def test_a_chain_writer_in_postgres_needs_its_agent() -> None:
    with pytest.raises(ConfigError, match="needs the agent id of its chain"):
        open_chain_writer(location("postgresql://gw@127.0.0.1:1/audit"))
