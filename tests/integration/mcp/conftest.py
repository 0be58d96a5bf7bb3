"""Fixtures of the MCP suites: alice serving her capabilities as MCP tools over HTTPS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from tests.integration.mcp.mcp_support import serving_mcp
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.task_capabilities import TaskGate


@pytest.fixture
def gate() -> TaskGate:
    """Capabilities that wait, report progress and see their cancellation (``job.*``)."""
    return TaskGate()


@pytest.fixture
async def alice(
    pki: Pki, tmp_path: Path, counter: WriteCounter, gate: TaskGate
) -> AsyncIterator[Agent]:
    """alice serving ``[mcp] listen``: bob granted a typical set and the ``job.*`` gate,
    carol reads only, dave's grant expired, erin limited to one call a second, frank
    to one call in flight."""
    pki.ensure("erin")
    erin = grant("erin", ["text.echo"])
    erin.update(max_calls_per_second=1.0, burst=1)
    pki.ensure("frank")
    frank = grant("frank", ["text.echo", "job.linger"])
    frank.update(max_in_flight=1)
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant(
                "bob",
                [
                    "text.echo@^1",
                    "text.search@^1",
                    "notes.write@1",
                    "kv.put@1",
                    "kv.get",
                    "job.run",
                    "job.steps",
                    "job.linger",
                ],
                max_payload_bytes=1024,
            ),
            grant("carol", ["text.echo", "notes.write"], max_risk="read"),
            grant("dave", ["text.echo"], expires_at="2020-01-01T00:00:00Z"),
            erin,
            frank,
        ],
    )
    config = serving_mcp(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    registry = standard_registry(counter, tmp_path / "alice-state")
    for cap in gate.capabilities():
        registry.register(cap)
    agent = await started(config, registry)
    assert agent.config.id == spiffe("alice")
    yield agent
    await agent.stop()
