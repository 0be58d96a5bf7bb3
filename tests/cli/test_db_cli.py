"""Operator commands against a real PostgreSQL: db init/migrate, audit across agents."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest

from gateway.audit import AuditLog, AuditRecord
from gateway.audit.store.postgres import verify_agent_chains
from gateway.cli.main import main
from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.postgres.migrations import LATEST_VERSION
from gateway.storage import connection_source, location, open_chain_writer
from tests.agent_process import write_agent_toml
from tests.support import Pki, grant, started, write_policy

ALICE = "spiffe://example.org/agent/alice"
BOB = "spiffe://example.org/agent/bob"


def test_db_init_then_migrate(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "init", "--dsn", pg_dsn]) == 0
    every = ", ".join(str(version) for version in range(1, LATEST_VERSION + 1))
    assert f"applied migration(s) {every}; now {LATEST_VERSION}" in capsys.readouterr().out
    assert main(["db", "migrate", "--dsn", pg_dsn]) == 0
    assert "schema up to date" in capsys.readouterr().out
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (
            LATEST_VERSION,
        )


def test_db_init_refuses_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "init", "--dsn", "state/audit.sqlite"]) != 0
    assert "expected postgresql://" in capsys.readouterr().err


def _record(reason: str) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"req-{reason}",
        peer_id=ALICE,
        capability="kv.put",
        version_constraint="^1",
        served_version="1.0.0",
        decision="allow" if reason == "OK" else "refuse",
        reason=reason,
        payload_size=3,
        payload_sha256="ab" * 32,
        latency_ms=1.5,
    )


async def _two_agents(pg_dsn: str) -> None:
    for agent, reasons in ((ALICE, ["OK", "UNKNOWN_PEER"]), (BOB, ["RISK_NOT_GRANTED"])):
        log = AuditLog(open_chain_writer(location(pg_dsn), agent_id=agent))
        await log.start()
        for reason in reasons:
            log.record(_record(reason))
        await log.close()


async def test_audit_queries_across_agents(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    await _two_agents(pg_dsn)

    assert main(["audit", "--db", pg_dsn, "--refusals", "--capability", "kv.put", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((d["agent_id"], d["reason"]) for d in lines) == [
        (ALICE, "UNKNOWN_PEER"),
        (BOB, "RISK_NOT_GRANTED"),
    ]
    assert main(["audit", "--db", pg_dsn, "--agent", BOB]) == 0
    out = capsys.readouterr().out
    assert f"== {BOB}" in out and f"== {ALICE}" not in out and "RISK_NOT_GRANTED" in out


async def test_audit_verify_checks_every_chain(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _two_agents(pg_dsn)
    assert main(["audit", "verify", "--db", pg_dsn]) == 0
    assert "2 chain(s), 0 broken" in capsys.readouterr().out

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM audit_records WHERE agent_id = %s AND seq = 1", (ALICE,))

    assert main(["audit", "verify", "--db", pg_dsn]) == 1
    captured = capsys.readouterr()
    assert f"{ALICE}: seq 1: deleted" in captured.out
    assert f"{BOB}: chain intact (1 records)" in captured.out
    assert main(["audit", "verify", "--db", pg_dsn, "--agent", BOB]) == 0


async def test_demo_runs_on_postgres_twice_in_one_database(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.devtools.demo import run_demo

    for _ in range(2):  # the second run shares the database with the first
        assert await run_demo(pg_dsn) == 0
    out = capsys.readouterr().out
    assert out.count("audit chain of alice: intact") == 2
    reports = verify_agent_chains(connection_source(location(pg_dsn)))
    assert sorted(reports) == [f"spiffe://demo.a2agw/agent/{n}" for n in ("alice", "bob", "carol")]
    assert all(report.ok for report in reports.values())


async def test_checkpoints_catch_a_cut_tail_with_a_rewritten_head_in_postgres(
    pki: Pki, tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    toml = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=pg_dsn,
        state_dir=tmp_path / "alice-state",
        state_db=pg_dsn,
    )
    toml.write_text(toml.read_text() + "\n[audit_checkpoints]\nevery_records = 5\n")
    agent = await started(load_agent_config(toml))
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            for n in range(12):
                await bob.invoke("text.echo", {"text": f"{n}"})
                await agent.audit.flush()  # one commit each: checkpoints at 5 and 10
    finally:
        await agent.stop()
    assert main(["audit", "verify", "--db", pg_dsn, "--config", str(toml)]) == 0
    assert "checkpoints valid" in capsys.readouterr().out

    alice = agent.config.id
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # cut after 7, head rewritten
        conn.execute("DELETE FROM audit_records WHERE agent_id = %s AND seq > 7", (alice,))
        conn.execute(
            "UPDATE audit_heads SET count = 7, last_hash = (SELECT record_hash FROM "
            "audit_records WHERE agent_id = %s AND seq = 7) WHERE agent_id = %s",
            (alice, alice),
        )

    assert main(["audit", "verify", "--db", pg_dsn, "--config", str(toml)]) == 1
    out = capsys.readouterr().out
    assert f"{alice}: chain intact (7 records)" in out  # the chain alone cannot tell
    assert "ends_before_checkpoint" in out
