"""Fixtures of the A2A HTTP suites: alice serving JSON-RPC and REST over HTTPS."""

from __future__ import annotations

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    AgentFactory,
)


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    """alice as in the root conftest, plus ``[a2a] http_listen`` on 127.0.0.1:0."""
    return await make_agent(https=True)
