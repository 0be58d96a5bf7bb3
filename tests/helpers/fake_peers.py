"""Peers without a network, for the router and the plan driver: Describe answers as set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import PeerDescription, RemoteCapability
from gateway.errors import (
    GatewayError,
)
from gateway.outbound.router import Router
from policies.store import PolicyStore
from tests.helpers.agents import outbound_rule, spiffe, write_policy

BOB = spiffe("bob")


class FakePeer:
    """Answers Describe with one capability, or fails with ``error``; counts the asks."""

    def __init__(self, error: GatewayError | None = None, risk: str = "read") -> None:
        self.error = error
        self.risk = risk
        self.timeouts: list[float] = []

    async def describe(self, *, timeout: float = 5.0) -> PeerDescription:
        self.timeouts.append(timeout)
        if self.error is not None:
            raise self.error
        cap = RemoteCapability(
            "text.search", "1.0.0", self.risk, 2.5, False, "", {"properties": {"q": {}}}, {}, (), ()
        )
        return PeerDescription(BOB, "a2agw.v1", (cap,), 1024, "")


def router(tmp_path: Path, peer: FakePeer, cls: type[Router] = Router, **kw: Any) -> Router:
    policy = write_policy(tmp_path / "policy.toml", [], [outbound_rule("bob", ["text.search"])])
    return cls(
        registry=CapabilityRegistry(),
        policies=PolicyStore(policy),
        peers=[BOB],
        client_for=lambda _peer_id: peer,  # type: ignore[arg-type, return-value]
        **kw,
    )
