"""``[mcp]`` and ``[[mcp_upstreams]]`` refuse what cannot work when the config loads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import AgentConfig, McpUpstreamEntry
from gateway.server.mcp.protocol import JoinedWrites
from tests.support import Pki, agent_config, write_policy

TOOL = {"tool": "t", "capability": "x.t", "version": "1.0.0", "risk": "read", "timeout": 1.0}


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"name": "a", "tools": [TOOL]}, "either url"),
        (
            {"name": "a", "url": "http://127.0.0.1:1/mcp", "command": "x", "tools": [TOOL]},
            "not both",
        ),
        ({"name": "a", "url": "http://10.0.0.1:1/mcp", "tools": [TOOL]}, "loopback"),
        ({"name": "a", "url": "https://tools.example/mcp", "tools": [TOOL]}, "id: required"),
        (
            {"name": "a", "command": "x", "id": "spiffe://example.org/agent/t", "tools": [TOOL]},
            "no certificate",
        ),
        ({"name": "a", "url": "http://127.0.0.1:1/mcp", "args": ["-v"], "tools": [TOOL]}, "args"),
        ({"name": "A b", "command": "x", "tools": [TOOL]}, "a-z0-9-"),
        ({"name": "a", "command": "x", "tools": [TOOL, TOOL]}, "a tool appears twice"),
        ({"name": "a", "command": "x", "env": {"1X": "y"}, "tools": [TOOL]}, "variable name"),
        ({"name": "a", "command": "x", "tools": []}, "at least 1"),
        ({"name": "a", "command": "x", "tools": [{**TOOL, "tool": "has space"}]}, "A-Za-z0-9"),
    ],
)
def test_an_upstream_entry_that_cannot_work_is_refused(entry: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as refused:
        McpUpstreamEntry.model_validate(entry)
    assert problem in str(refused.value)


def _config(pki: Pki, base: Path, **extra: Any) -> AgentConfig:
    plain = agent_config(pki, base, "alice", write_policy(base / "p.toml", []))
    return AgentConfig.model_validate({**plain.model_dump(), **extra})


def test_names_are_unique_and_workers_share_a_fixed_port(pki: Pki, tmp_path: Path) -> None:
    one = {"name": "a", "command": "x", "tools": [TOOL]}
    with pytest.raises(ValidationError, match="a name appears twice"):
        _config(pki, tmp_path, mcp_upstreams=[one, {**one, "tools": [{**TOOL, "tool": "u"}]}])
    with pytest.raises(ValidationError, match="a capability name appears twice"):
        _config(pki, tmp_path, mcp_upstreams=[one, {**one, "name": "b"}])
    with pytest.raises(ValidationError, match="fixed port"):
        _config(pki, tmp_path, workers=2, mcp={"listen": "127.0.0.1:0"})
    assert _config(pki, tmp_path, workers=2, mcp={"listen": "127.0.0.1:7444"}).mcp is not None


def test_relative_paths_are_the_config_files(pki: Pki, tmp_path: Path) -> None:
    entry = {
        "name": "a",
        "command": "servers/tool.py",
        "cwd": "work",
        "stderr_file": "logs/tool.err",
        "tools": [TOOL],
    }
    resolved = _config(pki, tmp_path, mcp_upstreams=[entry]).resolved(tmp_path)
    [upstream] = resolved.mcp_upstreams
    assert upstream.command == str(tmp_path / "servers/tool.py")
    assert (upstream.cwd, upstream.stderr_file) == (tmp_path / "work", tmp_path / "logs/tool.err")
    bare = _config(pki, tmp_path, mcp_upstreams=[{**entry, "command": "uvx"}]).resolved(tmp_path)
    assert bare.mcp_upstreams[0].command == "uvx"  # a bare name is looked up on PATH


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


async def test_writes_of_one_turn_leave_together() -> None:
    raw = _Recorder()
    joined = JoinedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    joined.write(b"head ")
    joined.write(b"body")
    assert raw.writes == []
    await asyncio.sleep(0)
    assert raw.writes == [b"head body"]
    joined.write(b"last")
    joined.close()  # what was queued goes first
    assert (raw.writes[-1], raw.closed) == (b"last", True)
    other = _Recorder()
    dropped = JoinedWrites(other, asyncio.get_running_loop())  # type: ignore[arg-type]
    dropped.write(b"never sent")
    dropped.abort()
    await asyncio.sleep(0)
    assert (other.writes, other.aborted) == ([], True)
    assert dropped.get_extra_info("peercert") == "info peercert"
