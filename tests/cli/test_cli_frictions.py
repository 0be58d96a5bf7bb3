"""What tripped people up at the command line: said here, before anything is sent.

``call --input`` that is not JSON is a usage error (exit 2) and no connection
is made; an empty listing says so instead of printing a bare header; an
IDEMPOTENCY_CONFLICT, a refusal for the caller, is a refusal in the audit log.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.main import EXIT_USAGE, main
from gateway.client.peer_client import PeerClient
from gateway.errors import IdempotencyConflict
from gateway.runtime.agent import Agent
from tests.agent_process import write_agent_toml
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A port that would accept a connection (and says if one came)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    yield server
    server.close()


def _config(pki: Pki, tmp_path: Path, peer_port: int) -> Path:
    return write_agent_toml(
        tmp_path / "bob.toml",
        pki,
        "bob",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "bob-policy.toml", []),
        audit_db=tmp_path / "bob-audit.sqlite",
        state_dir=tmp_path / "bob-state",
        peers=[(spiffe("alice"), f"127.0.0.1:{peer_port}")],
    )


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (
            "{not json",
            "--input: not valid JSON (Expecting property name enclosed in double "
            "quotes at line 1 column 2)",
        ),
        ('{"text": "a"}\n{"text": "b"}', "--input: not valid JSON (Extra data at line 2 column 1)"),
        ("", "--input: not valid JSON (Expecting value at line 1 column 1)"),
    ],
)
def test_input_that_is_not_json_is_a_usage_error_and_nothing_is_sent(
    pki: Pki,
    tmp_path: Path,
    listening: socket.socket,
    capsys: pytest.CaptureFixture[str],
    given: str,
    problem: str,
) -> None:
    config = _config(pki, tmp_path, listening.getsockname()[1])
    code = main(
        ["call", "--config", str(config), "--peer", spiffe("alice"), "text.echo", "--input", given]
    )
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == f"error: {problem}\n"
    with pytest.raises(BlockingIOError):
        listening.accept()  # no connection was even opened


def test_an_input_file_that_is_not_json_or_utf8_is_named(
    pki: Pki, tmp_path: Path, listening: socket.socket, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(pki, tmp_path, listening.getsockname()[1])
    for content, problem in (
        (b'{"text": 1,}', "not valid JSON (Expecting property name enclosed in double quotes"),
        (b'{"text": "\xff"}', "not UTF-8 (byte 11)"),
    ):
        (tmp_path / "input.json").write_bytes(content)
        argv = ["call", "--config", str(config), "--peer", spiffe("alice"), "text.echo"]
        assert main([*argv, "--input", f"@{tmp_path / 'input.json'}"]) == EXIT_USAGE
        assert capsys.readouterr().err.startswith(
            f"error: input file {tmp_path / 'input.json'}: {problem}"
        )
    with pytest.raises(BlockingIOError):
        listening.accept()


async def _serve_once(pki: Pki, tmp_path: Path) -> tuple[Agent, WriteCounter]:
    counter = WriteCounter()
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["notes.write"])])
    config = agent_config(pki, tmp_path, "alice", policy)
    return await started(config, standard_registry(counter, tmp_path / "alice-state")), counter


async def test_an_idempotency_conflict_is_a_refusal_in_the_audit_log(
    pki: Pki, tmp_path: Path
) -> None:
    alice, counter = await _serve_once(pki, tmp_path)
    try:
        async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
            await bob.invoke("notes.write", {"note": "a"}, idempotency_key="k")
            with pytest.raises(IdempotencyConflict):
                await bob.invoke("notes.write", {"note": "b"}, idempotency_key="k")
        await alice.audit.flush()
        rows = audit_rows(alice.config.audit_db)
    finally:
        await alice.stop()
    assert [(r.decision, r.reason) for r in rows] == [
        ("allow", "ADMITTED"),
        ("allow", "OK"),
        ("allow", "ADMITTED"),  # written before the key was looked at, as for every write
        ("refuse", "IDEMPOTENCY_CONFLICT"),
    ]
    assert counter.calls == 1


def test_empty_listings_say_so(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_stopped_at_once(pki, tmp_path))
    audit_db = str(tmp_path / "alice-audit.sqlite")
    assert main(["audit", "--db", audit_db]) == 0
    assert capsys.readouterr().out == "no records yet\n"
    argv = ["audit", "--db", audit_db, "--refusals", "--since", "10m", "--peer", spiffe("bob")]
    assert main(argv) == 0
    assert (
        capsys.readouterr().out
        == f"no records match --refusals --peer {spiffe('bob')} --since 10m\n"
    )
    assert main(["audit", "--db", audit_db, "--summary"]) == 0
    assert capsys.readouterr().out == "no records yet\n"
    assert main(["audit", "--db", audit_db, "--json"]) == 0
    assert capsys.readouterr().out == ""  # JSON lines: none
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=tmp_path / "alice-policy.toml",
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
    )
    assert main(["tasks", "--config", str(config)]) == 0
    assert capsys.readouterr().out == "no tasks (a plan run with `a2a-gateway run` makes one)\n"


async def _stopped_at_once(pki: Pki, tmp_path: Path) -> None:
    alice, _ = await _serve_once(pki, tmp_path)
    await alice.stop()
