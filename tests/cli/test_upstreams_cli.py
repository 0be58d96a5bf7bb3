"""``a2a-gateway serve`` fronting a real a2a-sdk agent from its TOML file, called by ``a2a-gateway call``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gateway.audit import query_records
from gateway.cli.main import EXIT_REFUSED
from gateway.storage import open_audit_reader
from tests.helpers.a2a_upstream import SdkAgent, closed_port, grpc_upstream
from tests.helpers.agent_process import REPO, AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, spiffe, write_policy

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).parent / "a2a-gateway")  # the active venv's entry point


def upstreams_toml(legacy_address: str, down_address: str) -> str:
    skill = 'version = "1.0.0"\nrisk = "read"\ntimeout = 5.0\n'
    return (
        f'[[upstreams]]\nid = "{spiffe("legacy")}"\naddress = "{legacy_address}"\nbinding = "grpc"\n'
        f'[[upstreams.skills]]\nskill = "echo"\ncapability = "legacy.echo"\n{skill}\n'
        f'[[upstreams]]\naddress = "{down_address}"\n'
        f'[[upstreams.skills]]\nskill = "echo"\ncapability = "gone.echo"\n{skill}'
    )


def agent_toml(
    pki: Pki, base: Path, name: str, grants: list[dict[str, object]], **kw: object
) -> Path:
    policy = write_policy(base / f"{name}-policy.toml", grants)
    return write_agent_toml(
        base / f"{name}.toml",
        pki,
        name,
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=base / f"{name}-audit.sqlite",
        state_dir=base / f"{name}-state",
        **kw,  # type: ignore[arg-type]
    )


async def cli_call(config: Path, capability: str, text: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI,
        "call",
        "--config",
        str(config),
        "--peer",
        spiffe("bob"),
        capability,
        "--input",
        json.dumps({"text": text}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_serve_fronts_the_upstream_and_call_reaches_it(pki: Pki, tmp_path: Path) -> None:
    legacy = SdkAgent()
    async with grpc_upstream(legacy, pki, "legacy") as address:
        bob_config = agent_toml(
            pki, tmp_path, "bob", [grant("alice", ["legacy.echo", "gone.echo"])], modules=[]
        )
        down = f"127.0.0.1:{closed_port()}"
        bob_config.write_text(bob_config.read_text() + upstreams_toml(address, down))
        bob = AgentProcess(bob_config)
        try:
            bob_address = await asyncio.to_thread(bob.start)
            alice_config = agent_toml(pki, tmp_path, "alice", [], peers=[("bob", bob_address)])
            ok = await cli_call(alice_config, "legacy.echo@^1", "from the cli")
            gone = await cli_call(alice_config, "gone.echo", "nobody home")
            assert await asyncio.to_thread(bob.terminate) == 0
        finally:
            bob.ensure_stopped()
    code, out, err = ok
    assert code == 0, err
    assert json.loads(out) == {"text": "echo: from the cli"}
    assert err.startswith("served legacy.echo@1.0.0 evidence sha256:")
    assert gone[0] == EXIT_REFUSED
    assert gone[2].startswith("failed: PEER_UNAVAILABLE: ")  # bob answered, nobody refused
    assert [r.parts for r in legacy.received] == [[{"text": "from the cli"}]]
    rows = query_records(open_audit_reader(tmp_path / "bob-audit.sqlite"))
    assert [(r.peer_id, r.capability, r.decision, r.reason, r.detail) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "OK", ""),
        (spiffe("alice"), "gone.echo", "allow", "PEER_UNAVAILABLE", "PEER_UNAVAILABLE"),
    ]
