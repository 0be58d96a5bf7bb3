"""Limits in tests: a fake clock, a grant with limits, refusals counted from the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.audit.summary import calls_in as refused_count
from gateway.runtime.agent import Agent
from policies.grants import PeerGrant
from tests.helpers.agents import (
    Pki,
    Probe,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    mesh_registry,
    spiffe,
    write_policy,
)

NO_REFILL = 0.0001  # one token per ~3 hours


def refused_by_reason(agent: Agent, peer: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in audit_rows(agent.config.audit_db):
        if row.peer_id == spiffe(peer) and row.decision == "refuse":
            totals[row.reason] = totals.get(row.reason, 0) + refused_count(row)
    return totals


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def peer_grant(**limits: Any) -> PeerGrant:
    return PeerGrant.model_validate(
        {
            "peer": "spiffe://example.org/agent/bob",
            "capabilities": ["text.echo"],
            "max_payload_bytes": 1024,
            "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
            **limits,
        }
    )


async def serve(
    pki: Pki,
    tmp_path: Path,
    grants: list[dict[str, Any]],
    counter: WriteCounter,
    probe: Probe | None = None,
    **config: Any,
) -> Agent:
    policy = write_policy(tmp_path / "alice-policy.toml", grants)
    settings = agent_config(pki, tmp_path, "alice", policy).model_copy(update=config)
    agent = Agent(settings, mesh_registry(counter, tmp_path / "alice-state", probe))
    await agent.start(watch_policy=False)
    return agent


def limited(name: str, capabilities: list[str], **limits: Any) -> dict[str, Any]:
    return {**grant(name, capabilities), **limits}
