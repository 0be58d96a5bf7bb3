"""Bad command-line input: a one-line error and a documented exit status, never a traceback.

Found by sweeping every subcommand with bad values (huge numbers, FIFOs, arguments
that are not UTF-8, terminal control characters, closed standard streams).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from gateway.audit import AuditLog
from gateway.storage import open_chain_writer
from tests.agent_process import REPO
from tests.cli.test_cli_checks import config_file
from tests.support import Pki, grant, write_policy

EXIT_USAGE = 2


def run(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=30,
        cwd=REPO,
    )
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr
    return result


def empty_audit_log(path: Path) -> Path:
    async def create() -> None:
        log = AuditLog(open_chain_writer(path))
        await log.start()
        await log.close()

    asyncio.run(create())
    return path


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_pki_issue_refuses_a_lifetime_beyond_x509_dates(pki: Pki) -> None:
    result = run("pki", "issue", "zed", "--dir", str(pki.dir), "--days", "99999999999")
    assert result.returncode == EXIT_USAGE
    assert last_line(result).startswith(
        "a2a-gateway pki issue: error: argument --days: must be 1..36500 days, not 99999999999"
    )
    assert not (pki.dir / "zed.pem").exists()


def test_pki_issue_refuses_days_that_are_not_a_whole_number(pki: Pki) -> None:
    result = run("pki", "issue", "zed", "--dir", str(pki.dir), "--days", "1e3")
    assert result.returncode == EXIT_USAGE
    assert last_line(result).startswith(
        "a2a-gateway pki issue: error: argument --days: not a whole number of days: '1e3'"
    )


def test_call_refuses_a_timeout_too_large_for_a_deadline(tmp_path: Path) -> None:
    result = run(
        "call",
        "--config",
        str(tmp_path / "unused.toml"),
        "--peer",
        "spiffe://example.org/agent/alice",
        "text.echo",
        "--input",
        "{}",
        "--timeout",
        "1e308",
    )
    assert result.returncode == EXIT_USAGE
    assert last_line(result).startswith(
        "a2a-gateway call: error: argument --timeout: '1e308': must be at most 86400 seconds"
    )


def test_an_argument_that_is_not_utf8_is_a_usage_error_that_hides_its_value() -> None:
    dsn = os.fsdecode(b"postgresql://u:secret\xffpw@127.0.0.1:1/db")
    result = run("audit", "--db", dsn)
    assert result.returncode == EXIT_USAGE
    assert last_line(result) == (
        "a2a-gateway: error: argument 3 is not valid UTF-8 (at character 22)"
    )
    assert "secret" not in result.stderr


def test_an_unrecognized_argument_is_shown_escaped() -> None:
    result = run("spiffe", "dns-name", "spiffe://x.org/a", "\x1b[31mred")
    assert result.returncode == EXIT_USAGE
    assert last_line(result) == "a2a-gateway: error: unrecognized arguments: \\x1b[31mred"
    assert "\x1b" not in result.stderr


def test_a_fifo_plan_is_refused_not_waited_on(pki: Pki, tmp_path: Path) -> None:
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    config = config_file(pki, tmp_path)
    for args in (
        ("plan", "check", str(fifo), "--config", str(config)),
        ("run", "--config", str(config), str(fifo)),
    ):
        result = run(*args)
        assert result.returncode in (1, EXIT_USAGE)  # plan check: a finding; run: exit 2
        assert (
            f"error: {fifo}: plan file unreadable: not a regular file"
            in result.stderr + result.stdout
        )


def test_a_fifo_certificate_or_checkpoint_file_is_refused(pki: Pki, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    audit = empty_audit_log(tmp_path / "audit.sqlite")
    base = ("audit", "verify", "--db", str(audit))
    result = run(*base, "--checkpoints", str(fifo), "--cert", str(pki.dir / "alice.pem"))
    assert result.returncode == EXIT_USAGE
    assert last_line(result) == f"error: checkpoint file {fifo}: cannot read: not a regular file"
    result = run(*base, "--checkpoints", str(audit), "--cert", str(fifo))
    assert result.returncode == EXIT_USAGE
    assert last_line(result) == f"error: certificate file {fifo}: unreadable (not a regular file)"


def test_a_closed_stdout_or_stderr_is_not_a_crash(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    closed = subprocess.run(
        f"{sys.executable} -m gateway.cli.main policy check {policy} >&-; echo $?",
        shell=True,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert closed.stdout.strip() == "0"
    assert "Traceback" not in closed.stderr
    closed = subprocess.run(
        f"{sys.executable} -m gateway.cli.main policy check {tmp_path / 'none'} 2>&-; echo $?",
        shell=True,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert closed.stdout.strip() == str(EXIT_USAGE)


def test_paths_in_success_lines_are_escaped(tmp_path: Path) -> None:
    directory = tmp_path / "pki\x1b[31m"
    result = run("pki", "init", "--dir", str(directory), "--trust-domain", "example.org")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        f"CA for spiffe://example.org written to {tmp_path}/pki\\x1b[31m/ca.pem"
    )
    result = run("pki", "issue", "alice", "--dir", str(directory))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    policy = write_policy(tmp_path / "policy\x1b[2J.toml", [])
    result = run("policy", "check", str(policy))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{tmp_path}/policy\\x1b[2J.toml: ok (0 grants")


def test_an_empty_since_is_refused_not_ignored(tmp_path: Path) -> None:
    audit = empty_audit_log(tmp_path / "audit.sqlite")
    result = run("audit", "--db", str(audit), "--since", "")
    assert result.returncode == EXIT_USAGE
    assert last_line(result).startswith("error: --since '': expected a positive number")
