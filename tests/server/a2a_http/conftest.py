"""Fixtures of the A2A HTTP suites: alice serving JSON-RPC and REST over HTTPS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.a2a_http import serving_https
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    """alice as in the root conftest, plus ``[a2a] http_listen`` on 127.0.0.1:0."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant(
                "bob",
                ["text.echo@^1", "text.search@^1", "notes.write@1", "kv.put@1", "kv.get"],
                max_payload_bytes=1024,
            ),
            grant("carol", ["text.echo", "notes.write"], max_risk="read"),
            grant("dave", ["text.echo"], expires_at="2020-01-01T00:00:00Z"),
        ],
    )
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()
