"""A connection to the gRPC port that never finishes its handshake is dropped.

gRPC's own handshake deadline is 120 s, so silent connections (TCP only, or
TLS without the HTTP/2 preface) could pile up for two minutes each and hold
the process's descriptors; the agent's server gives them ``HANDSHAKE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl

import pytest

from gateway.runtime.agent import Agent
from gateway.transport import tls
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    grant,
    raw_channel,
)


@pytest.fixture
async def alice(monkeypatch: pytest.MonkeyPatch, make_agent: AgentFactory) -> Agent:
    monkeypatch.setattr(tls, "HANDSHAKE_SECONDS", 0.5)
    return await make_agent(grants=[grant("bob", ["text.echo"])])


def bobs_tls(pki: Pki) -> ssl.SSLContext:
    """bob's certificate, the session CA, HTTP/2: a handshake the server completes."""
    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    context.load_cert_chain(pki.dir / "bob.pem", pki.dir / "bob.key")
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    return context


async def until_closed(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while await reader.read(65536):
            pass


@pytest.mark.parametrize("layer", ["tcp", "tls"])
async def test_a_connection_that_sends_nothing_is_dropped(
    pki: Pki, alice: Agent, layer: str
) -> None:
    tls_context = bobs_tls(pki) if layer == "tls" else None
    reader, writer = await asyncio.open_connection("127.0.0.1", alice.port, ssl=tls_context)
    try:
        # The server's own HTTP/2 SETTINGS may come first, then the end; a
        # connection still open after 20 s fails the test (TimeoutError).
        await asyncio.wait_for(until_closed(reader), 20)
    finally:
        writer.close()
    async with raw_channel(pki, alice, "bob") as channel:  # the port still serves
        reply = await gateway_pb2_grpc.PeerGatewayStub(channel).Invoke(
            gateway_pb2.InvokeRequest(
                request_id="after-the-silent-one", capability="text.echo", payload=b'{"text":"hi"}'
            ),
            timeout=20,
        )
    assert json.loads(reply.payload) == {"text": "hi"}
