"""The audit log in a shared PostgreSQL table: one chain per agent, replicas, migrations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from gateway.audit import AuditLog, AuditRecord, query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.audit.store.postgres import (
    audit_columns_covered,
    query_agent_records,
    verify_agent_chains,
)
from gateway.audit.store.sqlite_schema import CHAIN_COLUMNS, RECORD_COLUMNS
from gateway.errors import ConfigError
from gateway.postgres.migrations import LATEST_VERSION
from gateway.storage import connection_source, location, open_audit_reader, open_chain_writer

RecordFactory = Callable[..., AuditRecord]
ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"


async def test_agents_and_replicas_writing_at_once_keep_every_chain_intact(
    pg_dsn: str, make_record: RecordFactory
) -> None:
    dsn = location(pg_dsn)
    # Two replicas of alice and one bob, all appending concurrently, small batches.
    logs = [
        AuditLog(open_chain_writer(dsn, agent_id=ALICE), max_batch=7),
        AuditLog(open_chain_writer(dsn, agent_id=ALICE), max_batch=7),
        AuditLog(open_chain_writer(dsn, agent_id=BOB), max_batch=7),
    ]
    for log in logs:
        await log.start()
    await asyncio.gather(*(log.record_durable(make_record()) for log in logs for _ in range(150)))
    for log in logs:
        await log.close()

    reports = verify_agent_chains(connection_source(dsn))
    assert {agent: (r.ok, r.records) for agent, r in reports.items()} == {
        ALICE: (True, 300),
        BOB: (True, 150),
    }
    alice = sorted(r.seq for r in query_records(open_audit_reader(dsn), AuditFilter(agent=ALICE)))
    assert alice == list(range(1, 301))
    everyone = query_agent_records(connection_source(dsn), AuditFilter())
    assert sorted({entry.agent_id for entry in everyone}) == [ALICE, BOB]


async def test_tampering_with_one_agents_row_breaks_only_that_chain(
    pg_dsn: str, make_record: RecordFactory
) -> None:
    dsn = location(pg_dsn)
    for agent in (ALICE, BOB):
        log = AuditLog(open_chain_writer(dsn, agent_id=agent))
        await log.start()
        for _ in range(5):
            log.record(make_record())
        await log.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE audit_records SET reason = 'OK-ish' WHERE agent_id = %s AND seq = 3", (BOB,)
        )

    reports = verify_agent_chains(connection_source(dsn))

    assert reports[ALICE].ok
    assert [(p.seq, p.kind) for p in reports[BOB].problems] == [(3, "modified")]
    assert verify_chain(open_audit_reader(dsn), BOB).problems == reports[BOB].problems
    with pytest.raises(ConfigError, match="2 chains"):
        verify_chain(open_audit_reader(dsn))


async def test_a_newer_schema_refuses_to_start(pg_dsn: str) -> None:
    dsn = location(pg_dsn)
    log = AuditLog(open_chain_writer(dsn, agent_id=ALICE))
    await log.start()
    await log.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 'from the future', 0)", (99,))

    newer = AuditLog(open_chain_writer(dsn, agent_id=ALICE))
    with pytest.raises(ConfigError, match="schema version 99 is newer") as caught:
        await newer.start()

    assert caught.value.reason == "CONFIG_INVALID"
    assert not newer.healthy


async def test_table_holds_record_columns_only_and_migrations_cover_them(pg_dsn: str) -> None:
    log = AuditLog(open_chain_writer(location(pg_dsn), agent_id=ALICE))
    await log.start()
    await log.close()
    with psycopg.connect(pg_dsn) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'audit_records' ORDER BY ordinal_position"
            )
        ]
        versions = [row[0] for row in conn.execute("SELECT version FROM schema_migrations")]
    # No column could hold payload content: the record's fields and the chain only
    # (a field added by a later migration comes after the chain columns).
    assert len(columns) == len(set(columns))
    assert set(columns) == {"agent_id", *RECORD_COLUMNS, *CHAIN_COLUMNS}
    assert versions == list(range(1, LATEST_VERSION + 1))
    assert audit_columns_covered()


def test_a_dsn_without_agent_id_is_a_config_error(pg_dsn: str) -> None:
    with pytest.raises(ConfigError, match="agent id"):
        AuditLog(open_chain_writer(location(pg_dsn)))


def test_dsn_password_never_shows() -> None:
    dsn = location("postgresql://gw:s3cret@db.example:5432/a2agw")
    assert "s3cret" not in str(dsn) and "s3cret" not in repr(dsn)
    assert str(dsn) == "postgresql://gw:***@db.example:5432/a2agw"
