"""PostgreSQL stopped under load: the agent fails closed, then recovers without a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capabilities.registry import CapabilityRegistry
from gateway.audit import query_records, verify_chain
from gateway.audit.filter import AuditFilter
from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from gateway.storage import location, open_audit_reader
from gateway.transport.tls import channel_options
from tests.helpers.agents import Pki, WriteCounter, agent_config, grant, started, write_policy
from tests.helpers.postgres import PostgresCluster

_REFUSED_WHILE_DOWN = {"AUDIT_UNAVAILABLE", "STATE_UNAVAILABLE"}
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health_becomes(pki: Pki, agent: Agent, wanted: int) -> int:
    """Poll the agent's gRPC health (bounded) until it reports ``wanted``; returns the last."""
    tls = pki.material("bob")
    async with aio.secure_channel(
        agent.address, tls.channel_credentials(), options=channel_options(agent.config.id)
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status = -1
        for _ in range(120):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            status = reply.status
            if status == wanted:
                break
            await asyncio.sleep(0.25)
        return status


async def test_database_outage_fails_closed_and_recovers(
    pki: Pki,
    tmp_path: Path,
    postgres_cluster: PostgresCluster,
    pg_dsn: str,
    counter: WriteCounter,
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write"])])
    registry = CapabilityRegistry()
    registry.register(counter.capability())
    stores = {"audit_db": pg_dsn, "state_db": pg_dsn}
    agent = await started(agent_config(pki, tmp_path, "alice", policy, stores=stores), registry)
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            # Load before the outage: every write runs and is audited.
            await asyncio.gather(*(bob.invoke("notes.write", {"note": "a"}) for _ in range(20)))
            assert counter.calls == 20

            postgres_cluster.stop()
            try:
                outcomes = await asyncio.gather(
                    *(bob.invoke("notes.write", {"note": "b"}) for _ in range(20)),
                    return_exceptions=True,
                )
                reasons = {getattr(o, "reason", repr(o)) for o in outcomes}
                assert reasons <= _REFUSED_WHILE_DOWN, reasons
                assert counter.calls == 20  # nothing ran that the log could not show
                assert not agent.audit.healthy
                assert await _health_becomes(pki, agent, _NOT_SERVING) == _NOT_SERVING
            finally:
                postgres_cluster.start()

            # Same process, no restart: calls succeed again once the log reconnects.
            for _ in range(120):
                try:
                    await bob.invoke("notes.write", {"note": "c"})
                    break
                except GatewayError as err:
                    assert err.reason in _REFUSED_WHILE_DOWN
                    await asyncio.sleep(0.25)
            assert counter.calls == 21
            assert agent.audit.healthy
            assert await _health_becomes(pki, agent, _SERVING) == _SERVING
    finally:
        await agent.stop()
    dsn = location(pg_dsn)
    assert verify_chain(open_audit_reader(dsn), agent.config.id).ok
    reasons = [
        r.reason for r in query_records(open_audit_reader(dsn), AuditFilter(agent=agent.config.id))
    ]
    # Every write that ran has its write-ahead record and its outcome (outcomes
    # queued when the database went away are written after it came back).
    assert reasons.count("ADMITTED") == reasons.count("OK") == 21
    assert set(reasons) - {"ADMITTED", "OK"} <= _REFUSED_WHILE_DOWN


async def test_an_idle_agent_reports_the_outage_and_the_recovery(
    pki: Pki, tmp_path: Path, postgres_cluster: PostgresCluster, pg_dsn: str
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    stores = {"audit_db": pg_dsn, "state_db": pg_dsn}
    agent = await started(agent_config(pki, tmp_path, "alice", policy, stores=stores))
    try:
        postgres_cluster.stop()
        try:
            # No call needed: the idle writer's probe notices, so a balancer can
            # take this replica out before traffic reaches it.
            assert await _health_becomes(pki, agent, _NOT_SERVING) == _NOT_SERVING
            assert not agent.audit.healthy
        finally:
            postgres_cluster.start()
        assert await _health_becomes(pki, agent, _SERVING) == _SERVING
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            echoed = await bob.invoke("text.echo", {"text": "back"})
        assert echoed.output() == {"text": "back"}
    finally:
        await agent.stop()
