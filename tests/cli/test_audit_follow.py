"""``a2a-gateway audit --follow`` against a running agent, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.audit import AuditRecord, query_records
from gateway.audit.store.postgres import AgentRecord
from gateway.cli.audit_follow import render_line
from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from gateway.storage import location, open_audit_reader, open_chain_writer
from tests.agent_process import REPO, AgentProcess, LineReader, write_agent_toml
from tests.support import Pki, grant, spiffe, write_policy

LINE_TIMEOUT = 30.0


def _follower(*args: str) -> tuple[subprocess.Popen[str], LineReader, LineReader]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "audit", "--follow", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    return proc, LineReader(proc.stdout), LineReader(proc.stderr)


def _bare_follower(db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "audit", "--follow", "--db", str(db)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _interrupt(proc: subprocess.Popen[str], err: LineReader) -> tuple[int, str]:
    os.kill(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=LINE_TIMEOUT)
    while err.next_line(LINE_TIMEOUT) is not None:
        pass
    return code, "".join(err.seen)


def _wait_committed(store: str, count: int) -> None:
    where = location(store)
    deadline = time.monotonic() + LINE_TIMEOUT
    while len(query_records(open_audit_reader(where))) < count:
        assert time.monotonic() < deadline, f"fewer than {count} records committed"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


@pytest.fixture(params=["sqlite", "postgres"])
def audit_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "alice-audit.sqlite")
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


async def test_follow_prints_calls_as_they_commit_until_interrupted(
    pki: Pki, tmp_path: Path, audit_store: str
) -> None:
    shared = audit_store.startswith("postgresql://")
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])]),
        audit_db=audit_store,
        state_dir=tmp_path / "state",
        state_db=audit_store if shared else None,
    )
    agent = AgentProcess(config)
    table = refusals = None
    try:
        address = agent.start()
        async with PeerClient(spiffe("alice"), address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "before"})  # history: not followed
            _wait_committed(audit_store, 1)  # a read's record commits in the next batch
            table, table_out, table_err = _follower("--db", audit_store, "--peer", spiffe("bob"))
            header = table_out.next_line(LINE_TIMEOUT)
            assert header is not None and "REASON" in header and "TRACE ID" in header
            assert header.startswith("AGENT") == shared
            # --since: the window's records first (the "before" call), then live ones.
            refusals, json_out, json_err = _follower(
                "--db", audit_store, "--json", "--refusals", "--since", "10m"
            )
            await bob.invoke("text.echo", {"text": "secret-payload"})
            with pytest.raises(GatewayError) as refused:
                await bob.invoke("kv.get", {"key": "k"})
            assert refused.value.reason == "CAPABILITY_NOT_GRANTED"

            first, second = table_out.next_line(LINE_TIMEOUT), table_out.next_line(LINE_TIMEOUT)
            assert first is not None and second is not None
            assert " text.echo " in first and " OK " in first and spiffe("bob") in first
            assert " kv.get " in second and " CAPABILITY_NOT_GRANTED " in second
            line = json_out.next_line(LINE_TIMEOUT)
            assert line is not None
            record = json.loads(line)
            assert (record["capability"], record["reason"]) == ("kv.get", "CAPABILITY_NOT_GRANTED")
            assert ("agent_id" in record) == shared
            if shared:
                assert record["agent_id"] == spiffe("alice")

            await bob.invoke("text.echo", {"text": "later"})  # still following
            third = table_out.next_line(LINE_TIMEOUT)
            assert third is not None and " text.echo " in third and " OK " in third

        for proc, err in ((table, table_err), (refusals, json_err)):
            code, errors = _interrupt(proc, err)
            assert code in (0, 130) and errors == ""
        for out in (table_out, json_out):  # read to EOF: every line either printed is seen
            while out.next_line(LINE_TIMEOUT) is not None:
                pass
        seen = "".join(table_out.seen + json_out.seen)
        assert "secret-payload" not in seen and "before" not in seen
        assert len(json_out.seen) == 1  # only the refusal, once
        assert len(table_out.seen) == 4  # header and exactly three records
    finally:
        for proc in (table, refusals):
            if proc is not None:
                _stop(proc)
        agent.ensure_stopped()


def test_follow_refuses_verify_and_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.sqlite"
    for extra in (["verify"], ["--summary"]):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli.main",
                "audit",
                *extra,
                "--follow",
                "--db",
                f"{missing}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "error: --follow prints records; it does not go with verify or --summary"
        )
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "audit", "--follow", "--db", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: audit log {missing}: no such file"


def test_followed_lines_escape_what_peers_chose() -> None:
    record = AuditRecord(
        seq=1,
        time_unix_ms=1_700_000_000_000,
        request_id="r\n1",
        peer_id="spiffe://example.org/agent/\x1b[2Jbob",
        capability="kv.get\rforged",
        version_constraint="",
        served_version="",
        decision="refuse",
        reason="CAPABILITY_NOT_GRANTED",
        payload_size=3,
        payload_sha256="",
        latency_ms=0.5,
    )
    for shared in (False, True):
        entry = AgentRecord("spiffe://example.org/agent/\u202ealice", record)
        line = render_line(entry, json_lines=False, shared=shared)
        assert line.count("\n") == 1 and line.endswith("\n")
        assert not any(ch in line[:-1] for ch in "\x1b\r\n\u202e")
        as_json = render_line(entry, json_lines=True, shared=shared)
        assert as_json.count("\n") == 1 and "\x1b" not in as_json and "\u202e" not in as_json
        assert json.loads(as_json)["peer_id"] == record.peer_id


async def test_follow_ends_cleanly_on_sigterm_and_when_its_reader_goes_away(
    tmp_path: Path,
) -> None:
    from gateway.audit import AuditLog

    db = tmp_path / "audit.sqlite"
    log = AuditLog(open_chain_writer(db))
    await log.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        terminated, out, err = _follower("--db", str(db))
        procs.append(terminated)
        assert out.next_line(LINE_TIMEOUT) is not None  # the header: it is following
        os.kill(terminated.pid, signal.SIGTERM)
        assert terminated.wait(timeout=LINE_TIMEOUT) == 0
        assert out.next_line(LINE_TIMEOUT) is None and err.next_line(LINE_TIMEOUT) is None

        abandoned = _bare_follower(db)  # read by hand: a pipe being read cannot be closed
        procs.append(abandoned)
        err = LineReader(abandoned.stderr)
        assert abandoned.stdout is not None
        assert "REASON" in abandoned.stdout.readline()  # following (bounded by the header write)
        abandoned.stdout.close()  # like `| head -1` exiting
        for n in range(50):  # bounded: each record is one more write into the closed pipe
            await log.record_durable(
                AuditRecord(
                    time_unix_ms=int(time.time() * 1000),
                    request_id=f"req-{n}",
                    peer_id=spiffe("bob"),
                    capability="text.echo",
                    version_constraint="",
                    served_version="1.0.0",
                    decision="allow",
                    reason="OK",
                    payload_size=1,
                    payload_sha256="",
                    latency_ms=0.1,
                )
            )
            if abandoned.poll() is not None:
                break
            await asyncio.sleep(0.3)
        assert abandoned.wait(timeout=LINE_TIMEOUT) == 0
        assert err.next_line(LINE_TIMEOUT) is None  # no traceback, no "internal error"
    finally:
        for proc in procs:
            _stop(proc)
        await log.close()
