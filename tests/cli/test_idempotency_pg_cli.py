"""``a2a-gateway idempotency`` on keys shared by replicas in PostgreSQL (state_db a DSN)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from gateway.audit import query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.cli.main import main
from gateway.postgres.migrations import migrate
from gateway.storage import location, open_audit_reader
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy

ALICE, BOB = spiffe("alice"), spiffe("bob")


def _dead_owner() -> str:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, socket; print(f'{socket.gethostname()}:{os.getpid()}:x')",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return child.stdout.strip()


@pytest.fixture
def toml(pki: Pki, tmp_path: Path, pg_dsn: str) -> Path:
    """alice with audit and state in PostgreSQL, and keys in every state."""
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["kv.put"])])
    path = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=pg_dsn,
        state_dir=tmp_path / "alice-state",
        state_db=pg_dsn,
    )
    (tmp_path / "alice-state").mkdir()  # as the agent left it
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, "test")
        for key, state, owner in (
            ("done", "done", ""),
            ("doubt", "in_doubt", ""),
            ("dead-claim", "claimed", _dead_owner()),
            ("live-claim", "claimed", f"{socket.gethostname()}:1:x"),
        ):
            conn.execute(
                "INSERT INTO idempotency (agent_id, peer, capability, key, request_sha256, "
                "state, served_version, payload, claim_owner, updated_unix_ms) "
                "VALUES (%s, %s, 'kv.put', %s, 'ab', %s, '1.0.0', %s, %s, %s)",
                (ALICE, BOB, key, state, b"{}" if state == "done" else None, owner, 10**13),
            )
    return path


def _state(dsn: str, key: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state FROM idempotency WHERE key = %s", (key,)).fetchone()
    return None if row is None else str(row[0])


def _resolve(toml: Path, key: str, *how: str) -> int:
    fixed = ["idempotency", "resolve", "--config", str(toml), "--peer", BOB]
    return main([*fixed, "--capability", "kv.put", "--key", key, *how])


def test_list_shows_a_dead_replicas_claim_as_in_doubt(
    toml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["idempotency", "list", "--config", str(toml), "--in-doubt", "--json"]) == 0
    keys = sorted(json.loads(line)["key"] for line in capsys.readouterr().out.splitlines())
    assert keys == ["dead-claim", "doubt"]


def test_resolve_and_release_are_audited_in_the_shared_chain(toml: Path, pg_dsn: str) -> None:
    output = '{"key": "k", "revision": 4}'
    assert _resolve(toml, "doubt", "--done", "--output-json", output, "--reason", "saw it") == 0
    assert _resolve(toml, "dead-claim", "--release", "--reason", "not written") == 0

    assert _state(pg_dsn, "doubt") == "done"
    assert _state(pg_dsn, "dead-claim") is None
    dsn = location(pg_dsn)
    records = query_records(open_audit_reader(dsn), AuditFilter(agent=ALICE))
    assert [r.reason for r in records] == ["IDEMPOTENCY_RESOLVED", "IDEMPOTENCY_RELEASED"]
    assert "saw it" in records[0].detail and '"revision"' not in records[0].detail
    assert verify_chain(open_audit_reader(dsn), ALICE).ok


@pytest.mark.parametrize("key", ["done", "live-claim", "missing"])
def test_keys_not_in_doubt_are_left_alone(toml: Path, pg_dsn: str, key: str) -> None:
    before = _state(pg_dsn, key)
    assert _resolve(toml, key, "--release", "--reason", "r") != 0
    assert _state(pg_dsn, key) == before
    assert query_records(open_audit_reader(location(pg_dsn))) == []
