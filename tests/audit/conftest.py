"""Fixtures for the audit log tests: record factories, real logs, a pristine log to copy."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.audit import AuditLog, AuditRecord, Decision, query_records
from gateway.config import AgentConfig
from gateway.postgres.dsn import StoreLocation
from gateway.storage import location, open_audit_reader, open_chain_writer
from tests.helpers.agents import Pki
from tests.helpers.audit_logs import (
    AGENT,
    CALLS,
    RECORDS,
    RecordFactory,
    checkpointing_config,
    run_refused_calls,
)
from tests.helpers.postgres import PostgresCluster


@pytest.fixture
def make_record() -> RecordFactory:
    """A factory of distinct, valid records; keyword arguments override fields."""
    counter = itertools.count(1)

    def make(**overrides: Any) -> AuditRecord:
        n = next(counter)
        fields: dict[str, Any] = {
            "time_unix_ms": int(time.time() * 1000),
            "request_id": f"req-{n:04d}",
            "peer_id": "spiffe://example.org/agent/alice",
            "capability": "summarize",
            "version_constraint": "^1.0",
            "served_version": "1.2.0",
            "decision": "allow",
            "reason": "OK",
            "payload_size": 100 + n,
            "payload_sha256": hashlib.sha256(str(n).encode()).hexdigest(),
            "latency_ms": 1.25 + n,
        }
        fields.update(overrides)
        return AuditRecord(**fields)

    return make


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.db"


@pytest.fixture(params=["sqlite", "postgres"])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> StoreLocation:
    """A fresh audit store of each backend: a SQLite path, then a PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "audit.db"
    return location(request.getfixturevalue("pg_dsn"))


@pytest.fixture
async def audit_log(db_path: StoreLocation) -> AsyncIterator[AuditLog]:
    """A started log in a fresh store, closed after the test."""
    log = AuditLog(open_chain_writer(db_path, agent_id=AGENT))
    await log.start()
    yield log
    await log.close()


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


@pytest.fixture
async def alice_log(pki: Pki, tmp_path: Path) -> AgentConfig:
    """alice's config after a real agent ran CALLS calls and stopped (checkpoints written)."""
    config = checkpointing_config(pki, tmp_path)
    await run_refused_calls(pki, config, CALLS)
    return config
