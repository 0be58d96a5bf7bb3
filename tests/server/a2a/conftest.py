"""Fixtures of the A2A suites: bob and carol as a2a-sdk clients of alice."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import A2APeer
from tests.helpers.agents import Pki


@pytest.fixture
async def bob(pki: Pki, alice: Agent) -> AsyncIterator[A2APeer]:
    async with A2APeer(pki, alice, "bob") as peer:
        yield peer


@pytest.fixture
async def carol(pki: Pki, alice: Agent) -> AsyncIterator[A2APeer]:
    async with A2APeer(pki, alice, "carol") as peer:
        yield peer
