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

import pytest

from gateway.audit import AuditLog
from gateway.storage import open_chain_writer
from policies.grants import MAX_PAYLOAD_CEILING
from tests.agent_process import REPO, write_agent_toml
from tests.cli.test_cli_checks import config_file
from tests.support import Pki, grant, spiffe, write_policy

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


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "oversize"])
def test_call_input_file_must_be_a_regular_file_a_peer_could_take(
    pki: Pki, tmp_path: Path, kind: str
) -> None:
    # A FIFO with no writer hung `call` for ever and /dev/zero was read until memory ran
    # out; a file over the payload ceiling was read whole to be refused by every peer.
    if kind == "fifo":
        source = tmp_path / "input.json"
        os.mkfifo(source)
    elif kind == "device":
        source = Path("/dev/zero")
    elif kind == "directory":
        source = tmp_path
    else:
        source = tmp_path / "input.json"
        source.write_bytes(b" " * (MAX_PAYLOAD_CEILING + 1))
    config = config_file(pki, tmp_path, peers=[("bob", "127.0.0.1:1")])
    result = run(
        "call", "--config", str(config), "--peer", spiffe("bob"), "text.echo",
        "--input", f"@{source}",
    )  # fmt: skip
    assert result.returncode == EXIT_USAGE
    why = (
        f"larger than {MAX_PAYLOAD_CEILING} bytes, the most any grant allows"
        if kind == "oversize"
        else "not a regular file"
    )
    assert result.stderr == f"error: input file {source}: {why}\n"


def test_call_input_file_at_the_payload_ceiling_is_read(pki: Pki, tmp_path: Path) -> None:
    source = tmp_path / "input.json"
    head, tail = b'{"text": "', b'"}'  # JSON: the input is checked before it is sent
    source.write_bytes(head + b"x" * (MAX_PAYLOAD_CEILING - len(head) - len(tail)) + tail)
    assert source.stat().st_size == MAX_PAYLOAD_CEILING
    config = config_file(pki, tmp_path, peers=[("bob", "127.0.0.1:1")])
    result = run(
        "call", "--config", str(config), "--peer", spiffe("bob"), "text.echo",
        "--input", f"@{source}", "--timeout", "5",
    )  # fmt: skip
    assert result.returncode == 1  # read and sent: nobody listens on port 1
    assert result.stderr.startswith("failed: PEER_UNAVAILABLE: ")


SPACED_SECRET = "S3cret pw"  # libpq takes a space in a URL password; it ended the redaction


def test_a_dsn_password_with_a_space_is_not_shown(pki: Pki, tmp_path: Path) -> None:
    dsn = f"postgresql://gw:{SPACED_SECRET}@127.0.0.1:1/audit"
    shown = "postgresql://gw:***@127.0.0.1:1/audit"
    config = write_agent_toml(
        tmp_path / "alice.toml", pki, "alice", listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "policy.toml", []),
        audit_db=dsn, state_dir=tmp_path / "state",
    )  # fmt: skip
    for args, says in (
        (("audit", "--db", dsn), f"error: audit database {shown}: cannot connect: "),
        (("audit", "verify", "--db", dsn), f"error: audit database {shown}: cannot connect: "),
        (("db", "init", "--dsn", dsn), f"error: database {shown}: "),
        (("demo", "--postgres", dsn), f"error: --postgres {shown}: cannot connect: "),
        (
            ("serve", "--config", str(config)),
            f"refused: AUDIT_UNAVAILABLE: audit database {shown}: ",
        ),
    ):
        result = run(*args)
        assert result.returncode == (1 if args[0] == "serve" else EXIT_USAGE), result
        assert last_line(result).startswith(says), result.stderr
        for piece in SPACED_SECRET.split():
            assert piece not in result.stderr + result.stdout, result.stderr


def test_demo_names_a_database_it_cannot_reach_as_a_usage_error() -> None:
    # It started the agents anyway, logged the pool's warning and exited 1 with
    # `refused: AUDIT_UNAVAILABLE`, though nobody refused anything.
    result = run("demo", "--postgres", "postgresql://gw:S3cret-pw@127.0.0.1:1/demo")
    assert result.returncode == EXIT_USAGE
    assert result.stderr.startswith(
        "error: --postgres postgresql://gw:***@127.0.0.1:1/demo: cannot connect: "
    )
    assert result.stderr.count("\n") == 1 and "S3cret-pw" not in result.stderr
    assert result.stdout == ""  # no agent was started


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("agent.example.org:7443", " (the HTTP bindings are served over TLS)"),
        ("http://agent.example.org:7443", " (the HTTP bindings are served over TLS)"),
        ("https://agent example.org", " (no whitespace or control characters)"),
        ("https://agent.example.org/a2a?x=1", " (no path, query or fragment)"),
        ("https://agent.example.org/", " (no path, query or fragment)"),
        ("https://agent.example.org:70000", " (a port is 1..65535)"),
        ("https://gw:pw@agent.example.org", " (a host and an optional port, nothing else)"),
        ("https://", " (a host and an optional port, nothing else)"),
    ],
)
def test_card_refuses_an_https_url_its_clients_could_not_use(
    pki: Pki, tmp_path: Path, url: str, why: str
) -> None:
    # Each was signed into the card: e.g. `https://agent.example.org/a2a?x=1/a2a/jsonrpc`.
    config = config_file(pki, tmp_path)
    result = run("card", "--config", str(config), "--https-url", url)
    assert result.returncode == EXIT_USAGE
    shown = url.replace(":pw@", ":***@")
    assert last_line(result) == (
        f"a2a-gateway card: error: argument --https-url: '{shown}': "
        f"expected https://HOST[:PORT]{why}"
    )
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("agent.example.org", "'agent.example.org': expected host:port"),
        ("agent.example.org:0", "'agent.example.org:0': port 0 is outside 1..65535"),
        (
            "https://agent.example.org:7443",
            "'https://agent.example.org:7443': an IPv6 host goes in brackets, e.g. [::1]:7001",
        ),
    ],
)
def test_card_refuses_a_grpc_url_peers_could_not_dial(
    pki: Pki, tmp_path: Path, url: str, why: str
) -> None:
    # `card --url` was signed into the card unchecked, as the gRPC interface's URL.
    result = run("card", "--config", str(config_file(pki, tmp_path)), "--url", url)
    assert result.returncode == EXIT_USAGE
    assert last_line(result) == f"a2a-gateway card: error: argument --url: {why}"
    assert result.stdout == ""


@pytest.mark.parametrize("url", ["https://agent.example.org:7443", "https://[::1]:7443"])
def test_card_lists_a_good_https_url_under_each_binding(pki: Pki, tmp_path: Path, url: str) -> None:
    config = config_file(pki, tmp_path)
    result = run("card", "--config", str(config), "--https-url", url)
    assert result.returncode == 0, result.stderr
    assert f'"url": "{url}/a2a/jsonrpc"' in result.stdout
    assert f'"url": "{url}/a2a/rest"' in result.stdout


@pytest.mark.parametrize(
    "extra",
    [
        ["--checkpoints", "CHECKPOINTS", "--cert", "CERT"],
        ["--cert", "CERT"],
        ["--config", "CONFIG"],
        ["--follow", "--checkpoints", "CHECKPOINTS", "--ca", "CERT"],
    ],
)
def test_checkpoint_options_without_verify_are_refused_not_ignored(
    pki: Pki, tmp_path: Path, extra: list[str]
) -> None:
    # `audit --db X --checkpoints F --cert C` listed the records and exited 0: the log
    # looked checked against its checkpoints, and nothing was checked.
    audit = empty_audit_log(tmp_path / "audit.sqlite")
    files = {
        "CHECKPOINTS": str(tmp_path / "audit.sqlite.checkpoints.jsonl"),
        "CERT": str(pki.dir / "alice.pem"),
        "CONFIG": str(config_file(pki, tmp_path)),
    }
    result = run("audit", "--db", str(audit), *(files.get(arg, arg) for arg in extra))
    assert result.returncode == EXIT_USAGE
    named = ", ".join(arg for arg in extra if arg.startswith("--") and arg != "--follow")
    assert result.stderr == (
        f"error: {named}: used only by audit verify (a2a-gateway audit verify --db ...); "
        "listing records checks no checkpoint\n"
    )
    assert result.stdout == ""


@pytest.mark.parametrize(
    "extra",
    [
        ["--refusals"],
        ["--peer", "spiffe://example.org/agent/bob", "--since", "1h"],
        ["--capability", "kv.put", "--trace", "0" * 32],
        ["--summary", "--json"],
    ],
)
def test_listing_filters_with_verify_are_refused_not_ignored(
    tmp_path: Path, extra: list[str]
) -> None:
    # `audit verify --refusals --since 1h` verified the whole chain and said so: it read as
    # "these records verified", and the filters were ignored.
    audit = empty_audit_log(tmp_path / "audit.sqlite")
    result = run("audit", "verify", "--db", str(audit), *extra)
    assert result.returncode == EXIT_USAGE
    named = ", ".join(arg for arg in extra if arg.startswith("--"))
    assert result.stderr == (
        f"error: {named}: audit verify checks the whole chain and prints no records; "
        "list them without verify\n"
    )
    assert result.stdout == ""
