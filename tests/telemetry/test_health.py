"""The gRPC health service tells the truth: audit log, policy, shutdown (real agents)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    Probe,
    WriteCounter,
    agent_config,
    grant,
    mesh_registry,
    raw_channel,
    started,
    write_policy,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(channel: grpc.aio.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


async def _becomes(channel: grpc.aio.Channel, wanted: int) -> None:
    """Wait (bounded in count and time) until the health service answers ``wanted``."""
    for _ in range(200):  # at most ~20 s on a loaded machine
        if await _status(channel) == wanted:
            assert await _status(channel, "a2agw.v1.PeerGateway") == wanted
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"health never became {wanted}")


async def _agent(pki: Pki, tmp_path: Path, probe: Probe | None = None) -> Agent:
    policy = write_policy(
        tmp_path / "alice-policy.toml", [grant("bob", ["text.echo", "slow.wait"])]
    )
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"audit_retry_seconds": 0.2}
    )
    return await started(config, mesh_registry(WriteCounter(), tmp_path / "alice-state", probe))


@pytest.mark.slow
async def test_not_serving_while_the_audit_log_cannot_record_then_serving_again(
    pki: Pki, tmp_path: Path
) -> None:
    agent = await _agent(pki, tmp_path)
    locker = sqlite3.connect(agent.config.audit_db, isolation_level=None, timeout=5.0)
    try:
        async with raw_channel(pki, agent, "bob") as channel:
            await _becomes(channel, SERVING)
            locker.execute("BEGIN EXCLUSIVE")
            from gateway.client.peer_client import PeerClient
            from gateway.errors import AuditUnavailable

            # mallory has no grant: her refusal must be durable before she hears of it.
            mallory_tls = pki.material("mallory")
            async with PeerClient(agent.config.id, agent.address, mallory_tls) as mallory:
                try:
                    await mallory.invoke("text.echo", {"text": "x"}, timeout=30)
                except AuditUnavailable:
                    pass
                else:
                    raise AssertionError("a call was answered while its record could not commit")
            assert not agent.audit.healthy
            await _becomes(channel, NOT_SERVING)
            locker.execute("ROLLBACK")
            await _becomes(channel, SERVING)
            assert agent.audit.healthy
            async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
                result = await bob.invoke("text.echo", {"text": "after"}, timeout=10)
            assert result.output() == {"text": "after"}
    finally:
        locker.close()
        await agent.stop()


@pytest.mark.slow
async def test_not_serving_while_the_policy_in_force_has_no_live_grant(
    pki: Pki, tmp_path: Path
) -> None:
    agent = await _agent(pki, tmp_path)
    try:
        async with raw_channel(pki, agent, "bob") as channel:
            await _becomes(channel, SERVING)
            write_policy(
                agent.config.policy,
                [grant("bob", ["text.echo"], expires_at="2020-01-01T00:00:00Z")],
            )
            assert agent.policies.reload() is None  # a valid file, but every grant expired
            await _becomes(channel, NOT_SERVING)
            write_policy(agent.config.policy, [grant("bob", ["text.echo"])])
            assert agent.policies.reload() is None
            await _becomes(channel, SERVING)
    finally:
        await agent.stop()
    assert (agent.policies.reloads_ok, agent.policies.reloads_rejected) == (2, 0)


async def test_not_serving_from_the_start_of_shutdown_while_calls_finish(
    pki: Pki, tmp_path: Path
) -> None:
    probe = Probe()
    agent = await _agent(pki, tmp_path, probe)
    from gateway.client.peer_client import PeerClient

    async with (
        raw_channel(pki, agent, "bob") as channel,
        PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob,
    ):
        await _becomes(channel, SERVING)
        call = asyncio.create_task(bob.invoke("slow.wait", {}, timeout=30))
        await asyncio.wait_for(probe.started.wait(), 10)
        # A Watch opened before shutdown hears the change (new RPCs are refused then).
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=30
        )
        assert (await watch.read()).status == SERVING
        stopping = asyncio.create_task(agent.stop(grace=20))
        assert (await watch.read()).status == NOT_SERVING
        assert not call.done()
        watch.cancel()
        probe.release.set()
        result = await call  # the call in flight still finishes
        await stopping
    assert result.output() == {"done": True}
