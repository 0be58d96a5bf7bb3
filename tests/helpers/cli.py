"""The a2a-gateway command as a test runs it, and the files of an agent it serves."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, write_policy


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
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


def config_file(
    pki: Pki,
    base: Path,
    *,
    grants: list[dict[str, object]] | None = None,
    outbound: list[dict[str, object]] | None = None,
    peers: list[tuple[str, str]] | None = None,
    modules: tuple[str, ...] = ("capabilities.builtin",),
) -> Path:
    policy = write_policy(base / "alice-policy.toml", grants or [], outbound)
    return write_agent_toml(
        base / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=base / "alice-audit.sqlite",
        state_dir=base / "alice-state",
        peers=peers or [],
        modules=modules,
    )
