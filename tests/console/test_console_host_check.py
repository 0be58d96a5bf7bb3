"""Probe: the loopback console answers only requests addressed to it (DNS rebinding).

The plain-HTTP console on 127.0.0.1 answered whatever ``Host`` a request
named. A web page the operator opens at ``http://evil.example:9465/`` can have
its name re-pointed at 127.0.0.1 (DNS rebinding); the browser then sends the
page's own same-origin GETs to the console with ``Host: evil.example:9465``,
and the page reads the live decisions, grants and audit facts (CSP and
read-only do not help: to the browser it is the attacker's own origin).
A browser always sends ``Host``; only an IP literal or ``localhost`` names
this listener.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import ConsoleSettings
from gateway.runtime.agent import Agent
from tests.helpers.agents import AgentFactory, grant, spiffe


@pytest.fixture(scope="module")
async def console_agent(make_shared_agent: AgentFactory) -> Agent:
    """One agent for the module (its tests only read): bob granted ``text.echo``, a console."""
    return await make_shared_agent(
        grants=[grant("bob", ["text.echo"])], console=ConsoleSettings(listen="127.0.0.1:0")
    )


async def _exchange(address: str, head: str) -> tuple[str, str]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode())
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(), 10)).decode()
    writer.close()
    status_and_headers, _, body = answer.partition("\r\n\r\n")
    return status_and_headers.split("\r\n", 1)[0], body


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:{port}",
        "evil.example",
        "localhost.evil.example:{port}",
        "127.0.0.1.nip.io:{port}",
        "x",
    ],
)
@pytest.mark.parametrize("path", ["/grants", "/events", "/readyz"])
async def test_a_request_for_another_host_is_refused(
    console_agent: Agent, host: str, path: str
) -> None:
    console = console_agent.console
    assert console is not None
    named = host.format(port=console.port)
    status, body = await _exchange(console.address, f"GET {path} HTTP/1.1\r\nHost: {named}\r\n\r\n")
    assert (status, body) == (
        "HTTP/1.1 421 Misdirected Request",
        "this console answers only requests for its own address\n",
    )
    assert spiffe("bob") not in body


@pytest.mark.parametrize(
    "host",
    ["{address}", "127.0.0.1", "localhost:{port}", "LOCALHOST", "[::1]:{port}", None],
)
async def test_requests_for_this_listener_are_answered(
    console_agent: Agent, host: str | None
) -> None:
    console = console_agent.console
    assert console is not None
    line = (
        ""
        if host is None
        else f"Host: {host.format(address=console.address, port=console.port)}\r\n"
    )
    status, body = await _exchange(console.address, f"GET /grants HTTP/1.1\r\n{line}\r\n")
    assert status == "HTTP/1.1 200 OK" and spiffe("bob") in body
