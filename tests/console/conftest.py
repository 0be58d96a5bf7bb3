"""The console tests' agent: alice, granting bob ``text.echo``, with a loopback console."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config import ConsoleSettings
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki, agent_config, grant, started, write_policy


@pytest.fixture
async def console_agent(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    """A started agent whose console listens on 127.0.0.1 (port picked), stopped after."""
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy)
    agent = await started(
        config.model_copy(update={"console": ConsoleSettings(listen="127.0.0.1:0")})
    )
    try:
        yield agent
    finally:
        await agent.stop()
