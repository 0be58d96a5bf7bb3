"""Describe shows only what the caller may call; server identity; health; reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capabilities import CallContext, CapabilityRegistry, ContractModel, capability
from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError, PeerIdentityMismatch, UnknownPeer
from gateway.runtime.agent import Agent
from gateway.transport.tls import channel_options
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    started,
    write_policy,
)


async def test_describe_lists_only_granted_capabilities(pki: Pki, alice: Agent) -> None:
    async with PeerClient(alice.config.id, alice.address, pki.material("carol")) as carol:
        description = await carol.describe()
    # carol: text.echo and notes.write granted, but max_risk=read hides the write capability.
    assert [(c.name, c.version, c.risk) for c in description.capabilities] == [
        ("text.echo", "1.0.0", "read")
    ]
    echo = description.capabilities[0]
    assert echo.input_schema["properties"]["text"]["type"] == "string"
    assert echo.input_schema["additionalProperties"] is False
    assert echo.examples == ({"input": {"text": "hi"}, "output": {"text": "hi"}},)
    assert description.agent_id == spiffe("alice")
    assert description.protocol_version == "a2agw.v1"
    assert description.max_payload_bytes == 65536


async def test_describe_by_unknown_peer_reveals_nothing(pki: Pki, alice: Agent) -> None:
    async with PeerClient(alice.config.id, alice.address, pki.material("mallory")) as mallory:
        with pytest.raises(UnknownPeer) as info:
            await mallory.describe()
    assert "text." not in info.value.message and "notes" not in info.value.message


async def test_client_refuses_a_server_with_another_identity(pki: Pki, alice: Agent) -> None:
    # bob expects carol at alice's address: alice's certificate does not carry carol's id.
    client = PeerClient(spiffe("carol"), alice.address, pki.material("bob"))
    with pytest.raises(GatewayError) as info:
        await client.invoke("text.echo", {"text": "x"}, timeout=3.0)
    await client.close()
    assert type(info.value) is PeerIdentityMismatch
    assert info.value.reason == "PEER_IDENTITY_MISMATCH"


async def test_health_service_reports_serving(pki: Pki, alice: Agent) -> None:
    material = pki.material("bob")
    async with grpc.aio.secure_channel(
        alice.address, material.channel_credentials(), options=channel_options(alice.config.id)
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service="a2agw.v1.PeerGateway"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_policy_reload_takes_effect_without_restart(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    agent = await started(agent_config(pki, tmp_path, "alice", policy))
    try:
        client = PeerClient(agent.config.id, agent.address, pki.material("bob"))
        assert (await client.invoke("text.echo", {"text": "a"})).output() == {"text": "a"}
        write_policy(policy, [grant("carol", ["text.echo"])])
        assert agent.policies.reload_if_changed() is None
        with pytest.raises(UnknownPeer):
            await client.invoke("text.echo", {"text": "a"})
        policy.write_text("this is [ not toml")
        error = agent.policies.reload_if_changed()
        assert error is not None and error.reason == "POLICY_INVALID"
        with pytest.raises(UnknownPeer):  # the previous (valid) policy still rules
            await client.invoke("text.echo", {"text": "a"})
        await client.close()
    finally:
        await agent.stop()


class Nap(ContractModel):
    seconds: float


class Done(ContractModel):
    ok: bool


@capability("test.nap", "1.0.0", risk="read", timeout=5.0)
async def nap(inp: Nap, ctx: CallContext) -> Done:
    """Sleep, then answer."""
    await asyncio.sleep(inp.seconds)
    return Done(ok=True)


async def test_graceful_shutdown_lets_in_flight_calls_finish(pki: Pki, tmp_path: Path) -> None:
    registry = CapabilityRegistry()
    registry.register(nap)
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["test.nap"])])
    agent = await started(agent_config(pki, tmp_path, "alice", policy), registry)
    client = PeerClient(agent.config.id, agent.address, pki.material("bob"))
    call = asyncio.create_task(client.invoke("test.nap", {"seconds": 0.3}))
    await asyncio.sleep(0.1)
    await agent.stop(grace=3.0)
    assert (await call).output() == {"ok": True}
    await client.close()


async def test_counter_fixture_is_wired(alice: Agent, counter: WriteCounter, pki: Pki) -> None:
    async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
        await bob.invoke("notes.write", {"note": "n"})
    assert counter.calls == 1
