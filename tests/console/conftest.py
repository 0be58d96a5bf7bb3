"""The console tests' agent (alice, granting bob ``text.echo``, with a loopback console) and
the browser that opens it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConsoleSettings
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki, agent_config, grant, started, write_policy
from tests.helpers.chromium import CHROMIUM, CHROMIUM_ARGS


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


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Debian's chromium, headless, driven by Playwright (skipped without Playwright)."""
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()
