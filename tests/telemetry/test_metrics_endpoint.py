"""The /metrics endpoint and its config: loopback only, off by default, peer labels opt-in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.client.peer_client import PeerClient
from gateway.config import MetricsSettings
from gateway.errors import CapabilityNotGranted, GatewayError
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    write_policy,
)


async def _get(address: str, path: str, method: str = "GET") -> tuple[str, str]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(), 10)).decode()
    writer.close()
    head, _, body = answer.partition("\r\n\r\n")
    return head.split("\r\n")[0], body


@pytest.mark.parametrize("listen", ["0.0.0.0:9464", "192.0.2.1:9464", "localhost:9464"])
def test_a_non_loopback_listen_is_refused_unless_allowed(listen: str) -> None:
    with pytest.raises(ValidationError, match="allow_remote"):
        MetricsSettings(listen=listen)
    assert MetricsSettings(listen=listen, allow_remote=True).listen == listen


def test_a_listen_without_a_port_is_refused() -> None:
    with pytest.raises(ValidationError, match="host:port"):
        MetricsSettings(listen="127.0.0.1")


async def _agent(pki: Pki, tmp_path: Path, settings: MetricsSettings | None) -> Agent:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(update={"metrics": settings})
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    return agent


async def test_metrics_are_off_unless_configured(pki: Pki, tmp_path: Path) -> None:
    agent = await _agent(pki, tmp_path, None)
    try:
        assert agent.telemetry.metrics_address is None
        assert agent.telemetry.metrics.prometheus_text() == ""
        assert agent.audit._observer is None  # nothing runs per record
    finally:
        await agent.stop()


async def test_peer_labels_exposition_and_other_paths(pki: Pki, tmp_path: Path) -> None:
    agent = await _agent(pki, tmp_path, MetricsSettings(listen="127.0.0.1:0", peer_labels=True))
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "hi"})
            with pytest.raises(CapabilityNotGranted):
                await bob.invoke("kv.get", {"key": "k"})
        await agent.audit.flush()
        address = agent.telemetry.metrics_address
        assert address is not None and address.startswith("127.0.0.1:")
        status, body = await _get(address, "/metrics")
        assert status == "HTTP/1.1 200 OK"
        assert (await _get(address, "/other"))[0] == "HTTP/1.1 404 Not Found"
        assert (await _get(address, "/metrics", "POST"))[0] == "HTTP/1.1 405 Method Not Allowed"
    finally:
        await agent.stop()
    bob_id = spiffe("bob")
    assert "# TYPE a2agw_decisions_total counter" in body
    assert (
        f'a2agw_decisions_total{{capability="text.echo",decision="allow",reason="OK",'
        f'peer="{bob_id}"}} 1' in body
    )
    assert (
        f'a2agw_decisions_total{{capability="kv.get",decision="refuse",'
        f'reason="CAPABILITY_NOT_GRANTED",peer="{bob_id}"}} 1' in body
    )
    assert "# TYPE a2agw_call_duration_seconds histogram" in body
    assert (
        f'a2agw_call_duration_seconds_count{{capability="text.echo",decision="allow",'
        f'peer="{bob_id}"}} 1' in body
    )
    assert 'a2agw_policy_reloads_total{result="ok"} 0' in body
    expiry = agent.tls.not_after().timestamp()
    assert f"a2agw_certificate_expiry_seconds {expiry!r}" in body
    assert 'a2agw_calls_in_flight{operation="Invoke"} 0' in body
    assert "a2agw_audit_commit_seconds_count" in body
    assert "a2agw_audit_queue_depth 0" in body
    assert "a2agw_a2a_tasks_running 0" in body
    assert '"hi"' not in body  # never payload content


async def test_limit_refusals_and_certificate_reloads_are_scraped(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [{**grant("bob", ["text.echo"]), "max_calls_per_second": 0.0001, "burst": 2}],
    )
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"metrics": MetricsSettings(listen="127.0.0.1:0")}
    )
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    try:
        reasons = []
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            for _ in range(5):
                try:
                    await bob.invoke("text.echo", {"text": "hi"})
                    reasons.append("OK")
                except GatewayError as err:
                    reasons.append(err.reason)
        assert reasons == ["OK", "OK", "RATE_LIMITED", "RATE_LIMITED", "RATE_LIMITED"]
        address = agent.telemetry.metrics_address
        assert address is not None
        _, body = await _get(address, "/metrics")
    finally:
        await agent.stop()
    assert 'a2agw_limit_refusals_total{reason="RATE_LIMITED"} 3' in body
    assert 'a2agw_limit_refusals_total{reason="CONCURRENCY_LIMITED"} 0' in body
    assert spiffe("bob") not in body  # peer labels are off by default
    assert 'a2agw_certificate_reloads_total{result="ok"} 0' in body
    assert 'a2agw_certificate_reloads_total{result="rejected"} 0' in body
    assert "a2agw_certificate_expiring_soon 0" in body
