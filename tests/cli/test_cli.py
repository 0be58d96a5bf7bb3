"""The a2a-gateway command line, run as users run it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.storage import open_chain_writer
from tests.agent_process import AgentProcess, write_agent_toml
from tests.support import Pki, grant, spiffe, write_policy


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )


def test_pki_init_and_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pki", "init", "--dir", str(tmp_path / "pki"), "--trust-domain", "acme.test"]) == 0
    assert main(["pki", "issue", "web", "--dir", str(tmp_path / "pki")]) == 0
    out = capsys.readouterr().out
    assert "spiffe://acme.test/agent/web" in out
    assert (tmp_path / "pki" / "web.pem").exists()
    assert main(["pki", "init", "--dir", str(tmp_path / "pki"), "--trust-domain", "acme.test"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: CA already exists") and err.count("\n") == 1


def test_policy_check_explains_problems_in_one_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_policy(tmp_path / "good.toml", [grant("bob", ["text.echo@^1"])])
    assert main(["policy", "check", str(good)]) == 0
    assert f"{spiffe('bob')}: text.echo@^1" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[grants]]\npeer = "bob"\ncapabilities = []\nmax_payload_bytes = 1\n'
        "expires_at = 2030-01-01T00:00:00Z\n"
    )
    assert main(["policy", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: grants[0] (peer bob).peer: 'bob' is not a SPIFFE ID" in err
    assert "Traceback" not in err


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    result = run("describe", "--config", str(tmp_path / "missing.toml"), "--peer", spiffe("x"))
    assert result.returncode == 2
    assert (
        result.stderr.strip() == f"error: {tmp_path / 'missing.toml'}: agent config file not found"
    )


def agent_files(
    pki: Pki,
    base: Path,
    name: str,
    *,
    grants: Sequence[dict[str, Any]] = (),
    outbound: Sequence[dict[str, Any]] = (),
    peers: Sequence[tuple[str, str]] = (),
    modules: Sequence[str] = ("capabilities.builtin",),
) -> Path:
    """Policy and config files of agent ``name`` (listening on 127.0.0.1:0)."""
    policy = write_policy(base / f"{name}-policy.toml", list(grants), list(outbound))
    return write_agent_toml(
        base / f"{name}.toml",
        pki,
        name,
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=base / f"{name}-audit.sqlite",
        state_dir=base / f"{name}-state",
        peers=peers,
        modules=modules,
    )


def test_serve_describe_call_audit_verify(pki: Pki, tmp_path: Path) -> None:
    alice = AgentProcess(
        agent_files(pki, tmp_path, "alice", grants=[grant("bob", ["text.search@^1", "kv.put"])])
    )
    try:
        bob = agent_files(pki, tmp_path, "bob", peers=[("alice", alice.start())])
        described = run("describe", "--config", str(bob), "--peer", spiffe("alice"), "--json")
        assert described.returncode == 0, described.stderr
        names = [c["name"] for c in json.loads(described.stdout)["capabilities"]]
        assert names == ["kv.put", "text.search"]

        ok = run(
            "call",
            "--config",
            str(bob),
            "--peer",
            spiffe("alice"),
            "text.search@^1",
            "--input",
            '{"query": "audit"}',
        )
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["items"][0]["id"] == "doc-3"

        (tmp_path / "in.json").write_text('{"key": "k"}')
        refused = run(
            "call",
            "--config",
            str(bob),
            "--peer",
            spiffe("alice"),
            "kv.get",
            "--input",
            f"@{tmp_path / 'in.json'}",
        )
        assert refused.returncode == 1
        assert refused.stderr.startswith("refused: CAPABILITY_NOT_GRANTED:")
        assert alice.terminate() == 0
    finally:
        alice.ensure_stopped()

    db = tmp_path / "alice-audit.sqlite"
    table = run("audit", "--db", str(db), "--refusals")
    assert table.returncode == 0
    assert "CAPABILITY_NOT_GRANTED" in table.stdout and "OK" not in table.stdout.split("\n", 1)[1]
    lines = run("audit", "--db", str(db), "--json", "--since", "10m").stdout.splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["OK", "CAPABILITY_NOT_GRANTED"]
    assert all('"audit"' not in line for line in lines)  # the query text never reaches the log
    assert run("audit", "verify", "--db", str(db)).returncode == 0

    conn = sqlite3.connect(db)
    conn.execute("UPDATE audit_records SET reason = 'OK' WHERE seq = 2")
    conn.commit()
    conn.close()
    broken = run("audit", "verify", "--db", str(db))
    assert broken.returncode == 1
    assert "seq 2: modified" in broken.stdout


def test_sighup_reloads_policy(pki: Pki, tmp_path: Path) -> None:
    alice = AgentProcess(agent_files(pki, tmp_path, "alice"))
    try:
        bob = agent_files(pki, tmp_path, "bob", peers=[("alice", alice.start())])
        call = (
            "call",
            "--config",
            str(bob),
            "--peer",
            spiffe("alice"),
            "text.echo",
            "--input",
            '{"text": "x"}',
        )
        assert run(*call).stderr.startswith("refused: UNKNOWN_PEER")
        write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
        assert alice.proc is not None
        os.kill(alice.proc.pid, signal.SIGHUP)
        for _ in range(50):  # the signal is handled asynchronously; bounded wait
            result = run(*call)
            if result.returncode == 0:
                break
            time.sleep(0.1)
        assert result.returncode == 0, result.stderr
    finally:
        alice.ensure_stopped()


async def test_audit_shows_and_filters_by_trace_id(tmp_path: Path) -> None:
    from gateway.audit import AuditLog, AuditRecord

    db = tmp_path / "audit.sqlite"
    log = AuditLog(open_chain_writer(db))
    await log.start()
    for n, trace_id in enumerate(
        ["4bf92f3577b34da6a3ce929d0e0e4736", "", "0af7651916cd43dd8448eb211c80319c"]
    ):
        await log.record_durable(
            AuditRecord(
                time_unix_ms=1_700_000_000_000 + n,
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
                trace_id=trace_id,
            )
        )
    await log.close()

    table = run("audit", "--db", str(db)).stdout.splitlines()
    assert table[0].split()[-2:] == ["TRACE", "ID"]
    assert [line.split()[-1] for line in table[1:]] == [
        "4bf92f3577b34da6a3ce929d0e0e4736", "-", "0af7651916cd43dd8448eb211c80319c",
    ]  # fmt: skip
    one = run("audit", "--db", str(db), "--json", "--trace", "0AF7651916CD43DD8448EB211C80319C")
    assert one.returncode == 0, one.stderr
    assert [json.loads(line)["request_id"] for line in one.stdout.splitlines()] == ["req-2"]
    assert run("audit", "verify", "--db", str(db)).returncode == 0
