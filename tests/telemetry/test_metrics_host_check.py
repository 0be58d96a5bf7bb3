"""Probe: the loopback ``[metrics]`` listener refuses a ``Host`` that does not name this machine.

docs/console.md: on loopback the console answers only a request whose ``Host``
is an IP address or ``localhost`` (``421`` otherwise), so a web page whose name
an attacker points at 127.0.0.1 (DNS rebinding) cannot read it.

Defect found: the ``[metrics]`` listener (``/metrics``, ``/healthz``,
``/readyz``; plain HTTP on loopback) answered any ``Host``. A page served from
``http://rebind.attacker.example:9464/`` whose name then resolves to 127.0.0.1
could read ``/metrics`` as same-origin: the capability names this agent serves,
refusal reasons and counts, and with ``peer_labels`` every caller's SPIFFE ID.
Now it answers such a request ``421 Misdirected Request`` with nothing of the
metrics, exactly as the console does; a request naming an IP literal or
``localhost`` (what Prometheus and probes send) and one without ``Host`` are
answered as before. ``allow_remote = true`` keeps answering any name (the
operator chose an open listener, as for the console).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import MetricsSettings
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    write_policy,
)

BOB = spiffe("bob")


async def _get(address: str, path: str, host: str | None) -> tuple[str, str]:
    """(status line, body) of one plain-HTTP GET with this ``Host`` (None: no Host)."""
    name, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(name, int(port))
    head = f"GET {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    writer.write((head + "\r\n").encode())
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(), 10)).decode()
    writer.close()
    status_head, _, body = answer.partition("\r\n\r\n")
    return status_head.split("\r\n")[0], body


async def _agent(pki: Pki, tmp_path: Path, *, allow_remote: bool = False) -> Agent:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    metrics = MetricsSettings(listen="127.0.0.1:0", peer_labels=True, allow_remote=allow_remote)
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(update={"metrics": metrics})
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
        await bob.invoke("text.echo", {"text": "hi"})
    await agent.audit.flush()
    return agent


@pytest.fixture(scope="module")
async def alice(pki: Pki, make_shared_agent: AgentFactory) -> Agent:
    """One agent for the module (its tests only read), after one call of bob's."""
    metrics = MetricsSettings(listen="127.0.0.1:0", peer_labels=True)
    agent = await make_shared_agent(grants=[grant("bob", ["text.echo"])], metrics=metrics)
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
        await bob.invoke("text.echo", {"text": "hi"})
    await agent.audit.flush()
    return agent


REBOUND = ["rebind.attacker.example", "rebind.attacker.example:9464", "localhost.attacker.example"]


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz"])
@pytest.mark.parametrize("host", REBOUND)
async def test_a_rebound_name_gets_421_and_nothing_of_the_metrics(
    alice: Agent, path: str, host: str
) -> None:
    address = alice.telemetry.metrics_address
    assert address is not None
    status, body = await _get(address, path, host)
    assert status == "HTTP/1.1 421 Misdirected Request"
    assert BOB not in body and "text.echo" not in body and "a2agw_" not in body


@pytest.mark.parametrize("host", ["127.0.0.1", "{address}", "localhost", "localhost:9464", None])
async def test_an_ip_literal_localhost_or_no_host_is_answered(
    alice: Agent, host: str | None
) -> None:
    address = alice.telemetry.metrics_address
    assert address is not None
    status, body = await _get(
        address, "/metrics", None if host is None else host.format(address=address)
    )
    assert status == "HTTP/1.1 200 OK"
    assert f'peer="{BOB}"' in body
    assert (await _get(address, "/healthz", host and host.format(address=address)))[0] == (
        "HTTP/1.1 200 OK"
    )


async def test_allow_remote_answers_any_name(pki: Pki, tmp_path: Path) -> None:
    agent = await _agent(pki, tmp_path, allow_remote=True)
    try:
        address = agent.telemetry.metrics_address
        assert address is not None
        status, body = await _get(address, "/metrics", "metrics.example.org")
    finally:
        await agent.stop()
    assert status == "HTTP/1.1 200 OK"
    assert f'peer="{BOB}"' in body


async def test_two_host_headers_are_a_bad_request(alice: Agent) -> None:
    address = alice.telemetry.metrics_address
    assert address is not None
    status, body = await _get(address, "/metrics", "127.0.0.1\r\nHost: rebind.attacker.example")
    assert status == "HTTP/1.1 400 Bad Request"
    assert "a2agw_" not in body
