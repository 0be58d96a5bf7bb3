"""`policy backtest` (old name `policy replay`) and `policy explain` through the real CLI, on
a real agent's audit log."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy
from tests.helpers.cli import run_cli as cli
from tests.helpers.cli import run_cli_async as cli_async


async def call(pki: Pki, agent: Agent, caller: str, capability: str, payload: Any) -> str:
    async with PeerClient(agent.config.id, agent.address, pki.material(caller)) as client:
        try:
            await client.invoke(capability, payload)
        except GatewayError as err:
            return err.reason
    return "OK"


@pytest.fixture
async def recorded(pki: Pki, tmp_path: Path) -> tuple[Path, Path]:
    """A real agent's audit log with allowed, policy-refused and input-refused calls."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant("bob", ["text.echo", "kv.put"], max_payload_bytes=1024, max_risk="write"),
            grant("carol", ["text.echo"]),
        ],
    )
    config_path = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
    )
    agent = Agent(load_agent_config(config_path))
    await agent.start(watch_policy=False)
    try:
        outcomes = [
            await call(pki, agent, "bob", "text.echo", {"text": "a"}),
            await call(pki, agent, "bob", "text.echo", {"text": "b"}),
            await call(pki, agent, "bob", "kv.put", {"key": "k", "value": "v"}),
            await call(pki, agent, "carol", "kv.put", {"key": "k", "value": "v"}),
            await call(pki, agent, "mallory", "text.echo", {"text": "c"}),
            await call(pki, agent, "bob", "text.echo", {"nope": 1}),
            await call(pki, agent, "bob", "text.echo", {"text": "x" * 2000}),
        ]
    finally:
        await agent.stop()
    assert outcomes == [
        "OK",
        "OK",
        "OK",
        "CAPABILITY_NOT_GRANTED",
        "UNKNOWN_PEER",
        "INVALID_INPUT",
        "PAYLOAD_TOO_LARGE",
    ]
    return agent.config.audit_db, config_path


def candidate(tmp_path: Path) -> Path:
    return write_policy(
        tmp_path / "candidate.toml",
        [
            grant("bob", ["text.echo"], max_payload_bytes=4096),
            grant("carol", ["text.echo", "kv.put"], max_risk="read"),
            grant("mallory", ["text.echo"]),
        ],
    )


def groups(result: subprocess.CompletedProcess[str]) -> dict[tuple[str, str, str], list[Any]]:
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    return {(g["peer_id"], g["capability"], g["direction"]): g["calls"] for g in data["groups"]}


async def test_replay_lists_every_changed_decision_grouped_by_peer_and_capability(
    recorded: tuple[Path, Path], tmp_path: Path
) -> None:
    db, _ = recorded
    result = await cli_async(
        "policy", "replay", "--db", str(db), "--policy", str(candidate(tmp_path)), "--json"
    )
    data = json.loads(result.stdout)
    assert (data["considered"], data["changed"]) == (6, 4)  # INVALID_INPUT and ADMITTED left out
    assert data["skipped_steps"] == ["risk_within_grant", "version_available"]
    found = groups(result)
    assert set(found) == {
        (spiffe("bob"), "kv.put", "allowed → refused"),
        (spiffe("bob"), "text.echo", "refused → allowed (version/risk not judged)"),
        (spiffe("carol"), "kv.put", "refused → allowed (version/risk not judged)"),
        (spiffe("mallory"), "text.echo", "refused → allowed (version/risk not judged)"),
    }
    [put] = found[(spiffe("bob"), "kv.put", "allowed → refused")]
    assert (put["recorded_reason"], put["new_reason"], put["new_step"]) == (
        "OK",
        "CAPABILITY_NOT_GRANTED",
        "capability_granted",
    )
    [big] = found[(spiffe("bob"), "text.echo", "refused → allowed (version/risk not judged)")]
    assert (big["recorded_reason"], big["payload_size"]) == (
        "PAYLOAD_TOO_LARGE",
        len(b'{"text":""}') + 2000,
    )


async def test_backtest_is_the_new_name_of_replay_and_answers_the_same(
    recorded: tuple[Path, Path], tmp_path: Path
) -> None:
    db, _ = recorded
    args = ("--db", str(db), "--policy", str(candidate(tmp_path)), "--json")
    backtest = await cli_async("policy", "backtest", *args)
    replay = await cli_async("policy", "replay", *args)
    assert (backtest.returncode, backtest.stderr) == (0, "")
    assert json.loads(backtest.stdout) == json.loads(replay.stdout)
    assert (json.loads(backtest.stdout)["considered"], json.loads(backtest.stdout)["changed"]) == (
        6,
        4,
    )
    assert "backtest (replay)" in (await cli_async("policy", "--help")).stdout


async def test_the_old_name_replay_warns_that_it_is_deprecated(
    recorded: tuple[Path, Path], tmp_path: Path
) -> None:
    db, _ = recorded
    args = ("--db", str(db), "--policy", str(candidate(tmp_path)), "--json")
    replay = await cli_async("policy", "replay", *args)
    assert (replay.returncode, replay.stderr) == (
        0,
        "warning: `policy replay` is deprecated; use `policy backtest`\n",
    )
    assert replay.stdout == (await cli_async("policy", "backtest", *args)).stdout


async def test_replay_with_the_agent_config_judges_risk_and_versions(
    recorded: tuple[Path, Path], tmp_path: Path
) -> None:
    db, config = recorded
    result = await cli_async(
        "policy", "replay", "--db", str(db), "--policy", str(candidate(tmp_path)),
        "--config", str(config), "--json",
    )  # fmt: skip
    found = groups(result)
    # carol's kv.put stays refused (now RISK_NOT_GRANTED): not a change.
    assert set(found) == {
        (spiffe("bob"), "kv.put", "allowed → refused"),
        (spiffe("bob"), "text.echo", "refused → allowed"),
        (spiffe("mallory"), "text.echo", "refused → allowed"),
    }
    table = await cli_async(
        "policy", "replay", "--db", str(db), "--policy", str(candidate(tmp_path)),
        "--config", str(config),
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "3 would change" in table.stdout
    assert "CAPABILITY_NOT_GRANTED (capability_granted)" in table.stdout
    same = await cli_async(
        "policy", "replay", "--db", str(db), "--policy", str(tmp_path / "alice-policy.toml")
    )
    assert "0 would change" in same.stdout


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["--peer", spiffe("bob"), "kv.put"], 1, ("refuse", "CAPABILITY_NOT_GRANTED", "capability_granted")),
        (["--peer", spiffe("carol"), "kv.put"], 1, ("refuse", "RISK_NOT_GRANTED", "risk_within_grant")),
        (["--peer", spiffe("bob"), "text.echo", "--size", "5000"], 1, ("refuse", "PAYLOAD_TOO_LARGE", "payload_within_cap")),
        (["--peer", spiffe("dave"), "text.echo"], 1, ("refuse", "UNKNOWN_PEER", "known_peer")),
        (["--peer", spiffe("mallory"), "text.echo@^2"], 1, ("refuse", "VERSION_NOT_AVAILABLE", "version_available")),
        (["--peer", spiffe("mallory"), "text.echo@^1"], 0, ("allow", "OK", "")),
    ],
)  # fmt: skip
async def test_explain_names_the_deciding_step(
    recorded: tuple[Path, Path], tmp_path: Path, args: list[str], code: int, expected: tuple
) -> None:
    _, config = recorded
    result = await cli_async(
        "policy", "explain", "--policy", str(candidate(tmp_path)), "--config", str(config),
        *args, "--json",
    )  # fmt: skip
    assert result.returncode == code, result.stderr
    data = json.loads(result.stdout)
    assert (data["decision"], data["reason"], data["step"]) == expected
    assert data["skipped_steps"] == []


def test_explain_without_config_says_what_it_skipped(tmp_path: Path) -> None:
    result = cli(
        "policy", "explain", "--policy", str(candidate(tmp_path)), "--peer", spiffe("carol"),
        "kv.put",
    )  # fmt: skip
    assert result.returncode == 0
    assert result.stdout.startswith("allow")
    assert "not judged without --config: version_available, risk_within_grant" in result.stderr
