"""The connection to one upstream A2A agent: an a2a-sdk client bound to its identity.

gRPC binding: a ``grpc.aio`` channel with this agent's certificate and
``grpc.ssl_target_name_override`` set to the DNS name derived from the
upstream's SPIFFE ID, exactly as ``PeerClient`` binds a peer: the TLS handshake
itself proves the server holds a CA-signed certificate for that ID, before any
request byte is sent. An upstream whose certificate carries only its SPIFFE ID
is reached the same way through ``gateway.client.spiffe_relay`` (``relay``).

JSON-RPC binding over https: an httpx client with this agent's certificate,
trusting only the bundle of the upstream's trust domain, whose every handshake
pins the upstream's SPIFFE ID by its URI SAN (``gateway.client.pinned_tls``),
so the same proof happens in the handshake; SNI names the derived DNS name.

Both bindings check every answer before the SDK reads it (``upstream_answers``,
``upstream_http``; over JSON-RPC each event of an SSE stream too, ``upstream_sse``).
A gRPC link sends a blocking ``SendMessage`` without the SDK client, on a plain
channel made alike (``upstream_sends``), which checks its answer the same way.
A gRPC channel also records its server streams, so that each is cancelled as
soon as the gateway stops reading it (``upstream_streams``).
Plaintext (no ``id``) is only ever configured for loopback IPs (the config
refuses anything else). The card is never fetched: the configured address or
URL is the only place requests go, whatever an upstream's card might claim
(and ``streaming = true`` in the config, not the card, says it streams).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import httpx
from a2a.client import Client, ClientConfig, ClientFactory, minimal_agent_card
from a2a.utils.constants import TransportProtocol
from grpc import aio

from gateway.client.a2a.upstream_answers import AnswerCheck
from gateway.client.a2a.upstream_http import BoundedTransport
from gateway.client.a2a.upstream_sends import GrpcSends
from gateway.client.a2a.upstream_streams import StreamCalls
from gateway.client.pinned_tls import pinned_context
from gateway.config import TlsSettings, UpstreamEntry
from gateway.transport.tls import (
    MESSAGE_CEILING,
    TlsMaterial,
    channel_options,
    relay_channel_options,
)
from policies.identity import svid_dns_name

_CONNECTIONS = 32
"""Most connections open to one JSON-RPC upstream (calls beyond wait for one)."""


@dataclass(slots=True)
class UpstreamLink:
    """An open a2a-sdk client to one upstream, and what must be closed with it.

    Attributes:
        client: The SDK client (non-streaming, one binding).
        http: The httpx client of a JSON-RPC link (the SDK does not close a
            client it was given); None for gRPC, whose channel the SDK closes.
        channel: The SDK client's gRPC channel (calls wait for it to be READY); None
            for JSON-RPC.
        sends: A gRPC link's blocking ``SendMessage``, on a plain channel of its own
            (a call waits for that one to be READY); None for JSON-RPC.
    """

    client: Client
    http: httpx.AsyncClient | None = None
    channel: aio.Channel | None = None
    streaming: Client | None = None
    """A streaming SDK client on the same channel (``[[upstreams]] streaming = true``)."""
    sends: GrpcSends | None = None

    async def aclose(self) -> None:
        """Close the SDK client and its channels or HTTP connections."""
        await self.client.close()
        if self.streaming is not None:
            await self.streaming.close()  # the same channel: closing again is harmless
        if self.sends is not None:
            await self.sends.channel.close()
        if self.http is not None:
            await self.http.aclose()


def open_link(
    entry: UpstreamEntry, tls: TlsMaterial, files: TlsSettings, relay: str | None = None
) -> UpstreamLink:
    """A client for ``entry`` (no connection is made until the first call).

    ``relay``: the gRPC target of a ``SpiffeRelay`` to the upstream, for one whose
    certificate carries only its SPIFFE ID.
    """
    if entry.binding == "grpc":
        assert entry.address is not None
        plain = entry.id is None or relay is not None
        credentials = None if plain else tls.channel_credentials(entry.id)
        channel = _grpc_channel(entry, credentials, relay, _interceptors())
        sends = GrpcSends(_grpc_channel(entry, credentials, relay, []))
        config = ClientConfig(
            streaming=False,
            supported_protocol_bindings=[TransportProtocol.GRPC],
            grpc_channel_factory=lambda _url: channel,  # never the card's URL
        )
        card = minimal_agent_card(entry.address, [TransportProtocol.GRPC])
        link = UpstreamLink(ClientFactory(config).create(card), channel=channel, sends=sends)
        if entry.streaming:
            streaming_card = minimal_agent_card(entry.address, [TransportProtocol.GRPC])
            streaming_card.capabilities.streaming = True  # as configured; never fetched
            streams = ClientConfig(
                streaming=True,
                supported_protocol_bindings=[TransportProtocol.GRPC],
                grpc_channel_factory=lambda _url: channel,
            )
            link.streaming = ClientFactory(streams).create(streaming_card)
        return link
    assert entry.url is not None
    http = _http_client(entry, tls, files)
    config = ClientConfig(
        streaming=False, supported_protocol_bindings=[TransportProtocol.JSONRPC], httpx_client=http
    )
    card = minimal_agent_card(entry.url, [TransportProtocol.JSONRPC])
    link = UpstreamLink(ClientFactory(config).create(card), http)
    if entry.streaming:  # the same connections, so the same bounds and identity check
        streaming_card = minimal_agent_card(entry.url, [TransportProtocol.JSONRPC])
        streaming_card.capabilities.streaming = True  # as configured; never fetched
        streams = ClientConfig(
            streaming=True,
            supported_protocol_bindings=[TransportProtocol.JSONRPC],
            httpx_client=http,
        )
        link.streaming = ClientFactory(streams).create(streaming_card)
    return link


def _grpc_channel(
    entry: UpstreamEntry,
    credentials: grpc.ChannelCredentials | None,
    relay: str | None,
    interceptors: Sequence[aio.ClientInterceptor],
) -> aio.Channel:
    # One credentials object for both channels of a link, so that gRPC core's
    # shared subchannel pool can serve both on one connection.
    assert entry.address is not None
    if entry.id is None:  # loopback only (checked when the config was loaded)
        limits = [
            ("grpc.max_receive_message_length", MESSAGE_CEILING),
            ("grpc.max_send_message_length", MESSAGE_CEILING),
        ]
        return aio.insecure_channel(entry.address, options=limits, interceptors=interceptors)
    if relay is not None:  # the relay pins the upstream's URI SAN
        options = relay_channel_options(entry.id)
        return aio.insecure_channel(relay, options=options, interceptors=interceptors)
    assert credentials is not None
    return aio.secure_channel(
        entry.address, credentials, options=channel_options(entry.id), interceptors=interceptors
    )


def _interceptors() -> list[AnswerCheck | StreamCalls]:
    return [AnswerCheck(), StreamCalls()]


def _http_client(entry: UpstreamEntry, tls: TlsMaterial, files: TlsSettings) -> httpx.AsyncClient:
    # Every connection may stay open: with fewer kept alive than opened, a burst
    # of calls closes the surplus when it ends and the next one pays a TLS
    # handshake per connection again (idle ones still close after httpx's 5 s).
    limits = httpx.Limits(max_connections=_CONNECTIONS, max_keepalive_connections=_CONNECTIONS)
    if entry.id is None:  # http:// to a loopback IP (checked when the config was loaded)
        transport = BoundedTransport(httpx.AsyncHTTPTransport(limits=limits, retries=0))
    else:
        context = client_tls_context(tls, entry.id, files)
        inner = httpx.AsyncHTTPTransport(verify=context, limits=limits, retries=0)
        transport = BoundedTransport(inner, server_name=svid_dns_name(entry.id))
    return httpx.AsyncClient(transport=transport, timeout=None, follow_redirects=False)


def client_tls_context(tls: TlsMaterial, upstream_id: str, files: TlsSettings) -> ssl.SSLContext:
    """A client context presenting this agent's certificate, trusting only the upstream's
    trust domain's bundle, and pinning the upstream's SPIFFE ID by its URI SAN
    (``gateway.client.pinned_tls.pinned_context``).

    Raises:
        PeerUnavailable: there is no bundle for the upstream's trust domain.
    """
    return pinned_context(tls, upstream_id, files)
