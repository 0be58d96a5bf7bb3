"""/healthz and /readyz on the metrics listener say what the gRPC health service says."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.client.peer_client import PeerClient
from gateway.config import MetricsSettings
from gateway.errors import AuditUnavailable
from gateway.runtime.agent import Agent
from gateway.telemetry.health_http import HealthState, health_answer
from tests.support import (
    Pki,
    Probe,
    WriteCounter,
    agent_config,
    grant,
    mesh_registry,
    raw_channel,
    write_policy,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _get(address: str, path: str) -> tuple[str, str, str]:
    """(status line, content type, body) of one plain-HTTP GET."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(), 10)).decode()
    writer.close()
    head, _, body = answer.partition("\r\n\r\n")
    lines = head.split("\r\n")
    kind = next(
        line.split(": ", 1)[1] for line in lines if line.lower().startswith("content-type: ")
    )
    return lines[0], kind, body


async def _grpc_status(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=5
    )
    return int(reply.status)


async def _both_become(
    agent: Agent, channel: grpc.aio.Channel, grpc_status: int, ready: tuple[str, str]
) -> None:
    """Wait (bounded) until gRPC health and /readyz agree on the wanted state."""
    address = agent.telemetry.metrics_address
    assert address is not None
    seen: tuple[int, str, str] = (0, "", "")
    for _ in range(200):  # at most ~20 s on a loaded machine
        status, _, body = await _get(address, "/readyz")
        seen = (await _grpc_status(channel), status, body)
        if seen == (grpc_status, *ready):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never became {grpc_status} {ready}; last {seen}")


async def _agent(pki: Pki, tmp_path: Path, probe: Probe | None = None) -> Agent:
    policy = write_policy(
        tmp_path / "alice-policy.toml", [grant("bob", ["text.echo", "slow.wait"])]
    )
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"audit_retry_seconds": 0.2, "metrics": MetricsSettings(listen="127.0.0.1:0")}
    )
    agent = Agent(config, mesh_registry(WriteCounter(), tmp_path / "alice-state", probe))
    await agent.start(watch_policy=False)
    return agent


async def test_ready_follows_the_audit_log_and_the_policy_like_grpc_health(
    pki: Pki, tmp_path: Path
) -> None:
    agent = await _agent(pki, tmp_path)
    locker = sqlite3.connect(agent.config.audit_db, isolation_level=None, timeout=5.0)
    try:
        address = agent.telemetry.metrics_address
        assert address is not None
        assert await _get(address, "/healthz") == (
            "HTTP/1.1 200 OK",
            "text/plain; charset=utf-8",
            "ok\n",
        )
        async with raw_channel(pki, agent, "bob") as channel:
            await _both_become(agent, channel, SERVING, ("HTTP/1.1 200 OK", "SERVING\n"))

            locker.execute("BEGIN EXCLUSIVE")
            async with PeerClient(agent.config.id, agent.address, pki.material("mallory")) as m:
                try:
                    await m.invoke("text.echo", {"text": "x"}, timeout=30)
                except AuditUnavailable:
                    pass
            unavailable = ("HTTP/1.1 503 Service Unavailable", "NOT_SERVING: audit log\n")
            await _both_become(agent, channel, NOT_SERVING, unavailable)
            assert (await _get(address, "/healthz"))[0] == "HTTP/1.1 200 OK"  # alive, not ready
            locker.execute("ROLLBACK")
            await _both_become(agent, channel, SERVING, ("HTTP/1.1 200 OK", "SERVING\n"))

            expired = [grant("bob", ["text.echo"], expires_at="2020-01-01T00:00:00Z")]
            write_policy(agent.config.policy, expired)
            assert agent.policies.reload() is None
            no_grant = ("HTTP/1.1 503 Service Unavailable", "NOT_SERVING: policy\n")
            await _both_become(agent, channel, NOT_SERVING, no_grant)
        assert (await _get(address, "/metrics"))[0] == "HTTP/1.1 200 OK"  # still served
        assert (await _get(address, "/other"))[0] == "HTTP/1.1 404 Not Found"
    finally:
        locker.close()
        await agent.stop()


async def test_not_ready_from_the_start_of_shutdown(pki: Pki, tmp_path: Path) -> None:
    probe = Probe()
    agent = await _agent(pki, tmp_path, probe)
    address = agent.telemetry.metrics_address
    assert address is not None
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
        call = asyncio.create_task(bob.invoke("slow.wait", {}, timeout=30))
        await asyncio.wait_for(probe.started.wait(), 10)
        stopping = asyncio.create_task(agent.stop(grace=20))
        await asyncio.sleep(0)  # stop() has begun
        ready = await _get(address, "/readyz")
        alive = await _get(address, "/healthz")
        probe.release.set()
        await call
        await stopping
    assert ready[0::2] == ("HTTP/1.1 503 Service Unavailable", "NOT_SERVING: shutting down\n")
    assert alive[0::2] == ("HTTP/1.1 503 Service Unavailable", "stopping\n")


def test_not_ready_before_the_server_publishes_health() -> None:
    assert health_answer("/readyz", lambda: HealthState(started=False, stopping=False)) == (
        "503 Service Unavailable",
        "NOT_SERVING: starting\n",
    )
    assert health_answer("/healthz", lambda: HealthState(started=False, stopping=False)) == (
        "200 OK",
        "ok\n",
    )
