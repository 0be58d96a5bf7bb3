"""Operator input the audit commands cannot use: a window too far back, an altered log, a
state directory ``serve`` creates. Each is one named line and exit 2 (or a private folder)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from gateway.audit import AuditLog, AuditRecord
from gateway.cli.main import main
from gateway.storage import connection_source, location, open_chain_writer
from tests.helpers.agent_process import REPO, AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy

NOT_STRICT = """
CREATE TABLE copied AS SELECT * FROM audit_records;
DROP TABLE audit_records;
CREATE TABLE audit_records AS SELECT * FROM copied;
DROP TABLE copied;
"""
"""Rebuild the table without STRICT, as someone editing the file could, so any type fits."""


def _record(n: int) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000) - 1000 + n,
        request_id=f"req-{n}",
        peer_id=spiffe("bob"),
        capability="kv.get",
        version_constraint="",
        served_version="",
        decision="refuse",
        reason="CAPABILITY_NOT_GRANTED",
        payload_size=12,
        payload_sha256="0" * 64,
        latency_ms=1.0,
    )


async def _write_log(where: Path | str, agent_id: str = "") -> None:
    log = AuditLog(open_chain_writer(location(str(where)), agent_id=agent_id))
    await log.start()
    for n in range(3):
        await log.record_durable(_record(n))
    await log.close()


def _alter(db: Path, script: str) -> None:
    conn = sqlite3.connect(db)
    conn.executescript(script)
    conn.commit()
    conn.close()


def _readers(db: str, policy: Path) -> list[list[str]]:
    return [
        ["audit", "--db", db],
        ["audit", "--db", db, "--json"],
        ["audit", "--db", db, "--summary"],
        ["policy", "backtest", "--policy", str(policy), "--db", db],
    ]


def test_a_since_too_far_back_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "audit.sqlite"
    asyncio.run(_write_log(db))
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["kv.get"])])
    for args in _readers(str(db), policy):
        for since in ("1000000000d", "99999999999d", "999999999d"):
            assert main([*args, "--since", since]) == 2, args
            assert capsys.readouterr().err == (
                f"error: --since '{since}': too far back (it reaches before the year 1)\n"
            )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            "UPDATE audit_records SET time_unix_ms = 99999999999999999 WHERE seq = 1",
            "time_unix_ms 99999999999999999 is out of range",
        ),
        (
            "UPDATE audit_records SET time_unix_ms = 'abc' WHERE seq = 1",
            "time_unix_ms must be a number, not str",
        ),
        ("UPDATE audit_records SET latency_ms = 'zz' WHERE seq = 1", "latency_ms must be a number"),
        ("UPDATE audit_records SET payload_size = NULL WHERE seq = 1", "payload_size must be a"),
    ],
)
def test_a_record_that_cannot_be_read_is_named_with_the_command_that_checks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str, why: str
) -> None:
    db = tmp_path / "audit.sqlite"
    asyncio.run(_write_log(db))
    _alter(db, NOT_STRICT + change + ";")
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["kv.get"])])
    for args in _readers(str(db), policy):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(
            f"error: audit log {db}: holds a record that cannot be read (seq 1: {why}"
        ), err
        assert err.endswith(f"); check the log with: a2a-gateway audit verify --db {db}\n"), err
        assert err.count("\n") == 1
    assert main(["audit", "verify", "--db", str(db)]) == 1
    assert f"{db}: seq 1: modified" in capsys.readouterr().out


@pytest.mark.slow
def test_following_an_altered_log_names_the_record(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    asyncio.run(_write_log(db))
    _alter(db, "UPDATE audit_records SET time_unix_ms = 99999999999999999 WHERE seq = 2;")
    follow = ["audit", "--db", str(db), "--follow", "--since", "1d"]
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *follow],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert (result.returncode, result.stderr) == (
        2,
        f"error: audit log {db}: holds a record that cannot be read (seq 2: time_unix_ms "
        f"99999999999999999 is out of range); check the log with: "
        f"a2a-gateway audit verify --db {db}\n",
    )


def test_an_altered_postgres_record_is_named(
    pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_write_log(pg_dsn, agent_id=spiffe("alice")))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE audit_records SET time_unix_ms = -99999999999999999 WHERE seq = 3")
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["kv.get"])])
    shown = connection_source(location(pg_dsn))
    for args in _readers(pg_dsn, policy):
        code = main([*args, "--agent", spiffe("alice")] if "backtest" in args else args)
        assert code == 2, args
        assert capsys.readouterr().err == (
            f"error: audit database {shown}: holds a record that cannot be read (seq 3: "
            f"time_unix_ms -99999999999999999 is out of range); check the log with: "
            f"a2a-gateway audit verify --db {shown}\n"
        )


@pytest.mark.slow
def test_serve_makes_a_missing_state_dir_private(pki: Pki, tmp_path: Path) -> None:
    state_dir = tmp_path / "new" / "state"
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "alice-policy.toml", []),
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=state_dir,
    )
    alice = AgentProcess(config)
    umask = os.umask(0o022)  # the usual one: it would leave new folders 0755
    try:
        alice.spawn()
    finally:
        os.umask(umask)
    try:
        alice.wait_serving()
        modes = [stat.S_IMODE(folder.stat().st_mode) for folder in (state_dir, state_dir.parent)]
        assert modes == [0o700, 0o700]
        assert alice.terminate() == 0
    finally:
        alice.ensure_stopped()
