"""CLI without surprises: each message says what happened and names a command that works."""

from __future__ import annotations

import json
import shlex
import socket
from pathlib import Path

import pytest

from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.cli.main import main
from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import GatewayError
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, started, write_policy
from tests.helpers.cli import run_cli as run


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bob_config(pki: Pki, base: Path, alice_address: str) -> Path:
    return write_agent_toml(
        base / "bob.toml",
        pki,
        "bob",
        listen="127.0.0.1:0",
        policy=write_policy(base / "bob-policy.toml", []),
        audit_db=base / "bob-audit.sqlite",
        state_dir=base / "bob-state",
        peers=[("alice", alice_address)],
    )


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = run("--version")
    assert result.returncode == 0
    assert result.stdout == f"a2a-gateway {version('a2a-peer-gateway')}\n"


def test_pki_init_twice_names_the_force_flag(tmp_path: Path) -> None:
    args = ("pki", "init", "--dir", str(tmp_path / "pki"), "--trust-domain", "acme.test")
    assert run(*args).returncode == 0
    again = run(*args)
    assert again.returncode == 2
    assert again.stderr == (
        f"error: CA already exists at {tmp_path / 'pki' / 'ca.pem'} (pass --force to replace it)\n"
    )
    assert run(*args, "--force").returncode == 0


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "soon"])
def test_call_timeout_must_be_positive(pki: Pki, tmp_path: Path, timeout: str) -> None:
    config = bob_config(pki, tmp_path, "127.0.0.1:1")
    result = run(
        "call",
        "--config",
        str(config),
        "--peer",
        spiffe("alice"),
        "text.echo",
        "--input",
        "{}",
        "--timeout",
        timeout,
    )
    assert result.returncode == 2
    assert "argument --timeout:" in result.stderr and "DEADLINE_EXCEEDED" not in result.stderr


def test_a_bad_constraint_is_quoted_as_written(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(VersionSyntaxError, match=r"^not a version constraint: '>>1'$"):
        VersionConstraint.parse(">>1")
    with pytest.raises(VersionSyntaxError, match=r"^not a version constraint: '>=1.x'$"):
        VersionConstraint.parse("^1, >=1.x")
    config = bob_config(pki, tmp_path, f"127.0.0.1:{closed_port()}")
    result = run(
        "call",
        "--config",
        str(config),
        "--peer",
        spiffe("alice"),
        "text.echo@>>1",
        "--input",
        "{}",
    )
    assert result.returncode == 2  # judged here, before any connection
    assert result.stderr == "error: text.echo@>>1: not a version constraint: '>>1'\n"


def test_a_connection_failure_is_not_called_a_refusal(pki: Pki, tmp_path: Path) -> None:
    config = bob_config(pki, tmp_path, f"127.0.0.1:{closed_port()}")
    result = run(
        "call",
        "--config",
        str(config),
        "--peer",
        spiffe("alice"),
        "text.echo",
        "--input",
        '{"text": "x"}',
        "--timeout",
        "5",
    )
    assert result.returncode == 1
    assert result.stderr.startswith("failed: PEER_UNAVAILABLE: ")
    assert "refused:" not in result.stderr


def test_the_approval_hint_is_a_command_that_works(pki: Pki, tmp_path: Path) -> None:
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=write_policy(tmp_path / "alice-policy.toml", []),
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice state",  # a space: the hint must quote the path
    )
    config = config.rename(tmp_path / "alice config.toml")
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "goal": "store",
                "max_risk": "write",
                "approval": {"min_risk": "write"},
                "steps": [
                    {"id": "put", "capability": "kv.put", "input": {"key": "k", "value": "v"}}
                ],
            }
        )
    )
    first = run("run", "--config", str(config), str(plan))
    assert first.returncode == 3, first.stderr
    hint = first.stderr.split("task waiting-approval: ", 1)[1].split(" (or --deny)", 1)[0]
    words = shlex.split(hint)
    assert words[:3] == ["a2a-gateway", "tasks", "--config"] and words[3] == str(config)
    assert words[-1] == "STEP"
    approved = run(*words[1:-1], "put", "--json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["state"] == "completed"


async def test_policy_replay_reads_a_postgres_audit_log(
    pki: Pki, tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=pg_dsn,
        state_dir=tmp_path / "alice-state",
        state_db=pg_dsn,
    )
    agent = await started(load_agent_config(config))
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "x"})
            with pytest.raises(GatewayError):
                await bob.invoke("kv.get", {"key": "k"})
        await agent.audit.flush()
    finally:
        await agent.stop()
    stricter = write_policy(tmp_path / "none.toml", [])
    args = ["policy", "replay", "--db", pg_dsn, "--policy", str(stricter)]
    assert main([*args, "--agent", spiffe("alice"), "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)
    assert main([*args, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"2 recorded policy decisions re-decided under {stricter}; 1 would change"
    )
    assert (
        f"{spiffe('bob')}  text.echo   allowed → refused  1      UNKNOWN_PEER (known_peer)" in out
    )
    assert (changes["considered"], changes["changed"]) == (2, 1)
    assert [(g["peer_id"], g["capability"]) for g in changes["groups"]] == [
        (spiffe("bob"), "text.echo")
    ]
    assert main(args) == 2
    assert "name the agent with --agent ID" in capsys.readouterr().err
