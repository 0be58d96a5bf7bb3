"""Audit logs for tests: the agent whose chain they write, a pristine log, tampering in each backend."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.audit import AuditRecord, verify_chain
from gateway.audit.chain import GENESIS_HASH
from gateway.audit.checkpoint_verify import verify_checkpoints
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, AuditCheckpoints
from gateway.errors import CapabilityNotGranted
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from tests.helpers.agents import Pki, agent_config, grant, write_policy

RecordFactory = Callable[..., AuditRecord]
AGENT = "spiffe://example.org/agent/carol"
"""The agent whose chain the tests write (a PostgreSQL table holds many)."""
RECORDS = 10
"""How many records the pristine log of ``tests/audit/conftest.py`` holds."""
Found = list[tuple[str, int]]


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


CALLS = 13


def checkpointing_config(
    pki: Pki, base: Path, name: str = "alice", **checkpoints: Any
) -> AgentConfig:
    policy = write_policy(base / f"{name}-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, base, name, policy)
    settings = AuditCheckpoints.model_validate({"every_records": 4, **checkpoints})
    return config.model_copy(update={"audit_checkpoints": settings})


async def run_refused_calls(pki: Pki, config: AgentConfig, calls: int, tag: str = "c") -> None:
    """Start the agent, make ``calls`` refused calls one by one, stop it gracefully.

    Refusals are committed one by one before their answer, so with
    ``every_records = 4`` the checkpoints land at exactly 4, 8, 12, ... and
    at the stop.
    """
    agent = Agent(config)
    await agent.start(watch_policy=False)
    client = PeerClient(config.id, agent.address, pki.material("bob"))
    try:
        for n in range(calls):
            with pytest.raises(CapabilityNotGranted):
                await client.invoke("kv.get", {"key": "x"}, request_id=f"{tag}-{n}")
    finally:
        await client.close()
        await agent.stop()


def checkpoint_problems(config: AgentConfig, cert: Path | None = None) -> Found:
    cert_pem = (cert or config.tls.cert).read_bytes()
    report = verify_checkpoints(
        open_audit_reader(config.audit_db), config.checkpoint_file, cert_pem
    )
    return [(problem.kind, problem.seq) for problem in report.problems]
