"""Fixtures for the audit log tests: record factories and real SQLite logs."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog, AuditRecord
from gateway.postgres.dsn import StoreLocation
from gateway.storage import location, open_chain_writer

RecordFactory = Callable[..., AuditRecord]


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


AGENT = "spiffe://example.org/agent/carol"
"""The agent whose chain the tests write (a PostgreSQL table holds many)."""


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
