"""alice serving the capabilities of a ``TaskGate`` (tests.helpers.task_capabilities)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.task_capabilities import TaskGate

JOBS = [
    "job.run",
    "job.write",
    "job.flood",
    "job.brief",
    "job.chatty",
    "text.echo",
    "notes.write",
]


async def start_alice(
    pki: Pki,
    tmp_path: Path,
    gate: TaskGate,
    *,
    bob: dict[str, Any] | None = None,
    stores: dict[str, str] | None = None,
) -> Agent:
    """Alice with the gate's capabilities; bob gets ``bob`` extra grant keys, carol the same."""
    policy = write_policy(tmp_path / "alice-policy.toml", task_grants(bob))
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in gate.capabilities():
        registry.register(cap)
    return await started(agent_config(pki, tmp_path, "alice", policy, stores=stores), registry)


def task_grants(bob: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """bob and carol may run every job; ``bob`` adds or replaces keys of bob's grant."""
    return [{**grant("bob", JOBS), **(bob or {})}, grant("carol", JOBS)]
