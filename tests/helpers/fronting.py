"""bob fronting upstream A2A agents through [[upstreams]]: skills, grants, clients, audit."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig
from gateway.runtime.agent import Agent
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, write_policy

LEGACY = spiffe("legacy")


SEARCH_IN = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 100}, "limit": {"type": "integer"}},
    "required": ["query"],
}


SEARCH_OUT = {
    "type": "object",
    "properties": {
        "hits": {"type": "array", "items": {"type": "string"}},
        "seen": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        },
    },
    "required": ["hits"],
}


def skills(prefix: str = "legacy", timeout: float = 5.0) -> list[dict[str, Any]]:
    """The skills bob serves from one upstream: text echo, structured search, a write."""
    return [
        {
            "skill": "echo",
            "capability": f"{prefix}.echo",
            "version": "1.0.0",
            "risk": "read",
            "timeout": timeout,
        },
        {
            "skill": "search",
            "capability": f"{prefix}.search",
            "version": "2.1.0",
            "risk": "read",
            "timeout": timeout,
            "input_schema": SEARCH_IN,
            "output_schema": SEARCH_OUT,
        },
        {
            "skill": "store",
            "capability": f"{prefix}.store",
            "version": "1.0.0",
            "risk": "write",
            "timeout": timeout,
        },
    ]


def bob_grants() -> list[dict[str, Any]]:
    return [
        grant(
            "alice",
            ["legacy.echo", "legacy.search", "legacy.store", "gone.echo"],
            max_payload_bytes=256,
        ),
        grant("carol", ["legacy.search", "legacy.store"], max_risk="read"),
    ]


async def start_bob(pki: Pki, base: Path, upstreams: list[dict[str, Any]]) -> Agent:
    """bob: no capabilities of its own, only the upstreams' skills."""
    policy_path = write_policy(base / "bob-policy.toml", bob_grants())
    plain = agent_config(pki, base, "bob", policy_path)
    config = AgentConfig.model_validate({**plain.model_dump(), "upstreams": upstreams})
    agent = Agent(config, CapabilityRegistry())
    await agent.start(watch_policy=False)
    return agent


@contextlib.asynccontextmanager
async def fronted(
    pki: Pki,
    base: Path,
    *upstreams: dict[str, Any],
    timeout: float = 5.0,
    asks_input: bool | None = None,
) -> AsyncIterator[Agent]:
    """bob fronting ``upstreams`` (the first as ``legacy.*``, a second as ``gone.*``;
    ``asks_input`` set on every skill unless None)."""
    asks = {} if asks_input is None else {"asks_input": asks_input}
    entries = [
        {**up, "skills": [{**skill, **asks} for skill in skills(prefix, timeout)]}
        for up, prefix in zip(upstreams, ("legacy", "gone"), strict=False)
    ]
    bob = await start_bob(pki, base, entries)
    try:
        yield bob
    finally:
        await bob.stop(grace=0)


def client(pki: Pki, bob: Agent, caller: str = "alice") -> PeerClient:
    return PeerClient(spiffe("bob"), bob.address, pki.material(caller))


async def records(bob: Agent) -> list[Any]:
    await bob.audit.flush()
    return audit_rows(bob.config.audit_db)


def outcome(record: Any) -> tuple[str, str, str, str]:
    return (record.peer_id, record.capability, record.decision, record.reason)
