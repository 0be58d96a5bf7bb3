"""A remote MCP server over Streamable HTTP: the SDK's transport on a client we bound.

The SDK's ``streamable_http_client`` speaks the protocol; the ``httpx2`` client
it is given decides what may reach it:

* ``https``: TLS 1.2+ with this agent's certificate, trusting only the bundle of
  the server's trust domain, and the handshake asks for, and verifies, the DNS
  name derived from the server's SPIFFE ID (as for peers and A2A upstreams),
  so only a server holding a certificate for ``id`` is ever sent a request;
* ``http``: only to a loopback IP literal (checked when the config loads);
* every answer (one JSON body, or one event stream) is at most
  ``max_answer_bytes``, counted as it arrives; a longer one is cut there
  (the call fails ``INVALID_OUTPUT``); answers must not be compressed
  (``Accept-Encoding: identity`` is asked; a compressed one is refused).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp.client.streamable_http import streamable_http_client

from gateway.client.a2a.upstream_links import client_tls_context
from gateway.config import McpUpstreamEntry, TlsSettings
from gateway.transport.tls import TlsMaterial
from policies.identity import svid_dns_name

CONNECT_SECONDS = 10.0
READ_SECONDS = 3600.0
"""The SDK's own read timeout: far beyond any call's (the capability's timeout ends a call)."""


class AnswerTooLarge(httpx2.StreamError):
    """An answer went past ``max_answer_bytes`` (the SDK reads it as a broken stream)."""


@dataclass
class HttpState:
    """What happened on one link (read by the upstream once a call fails).

    Attributes:
        oversized: An answer went past ``max_answer_bytes``, or came compressed (the
            upstream clears it once the call that failed for it has read it).
    """

    oversized: bool = False


@contextlib.asynccontextmanager
async def http_link(
    entry: McpUpstreamEntry, tls: TlsMaterial, files: TlsSettings, state: HttpState
) -> AsyncIterator[Any]:
    """The SDK's Streamable HTTP transport to ``entry.url`` on a bounded client."""
    assert entry.url is not None
    secure = entry.url.startswith("https://")
    if secure:
        assert entry.id is not None
        inner = httpx2.AsyncHTTPTransport(verify=client_tls_context(tls, entry.id, files))
    else:
        inner = httpx2.AsyncHTTPTransport()
    bounded = BoundedAnswers(
        inner,
        server_name=svid_dns_name(entry.id) if secure and entry.id else "",
        limit=entry.max_answer_bytes,
        state=state,
    )
    timeout = httpx2.Timeout(CONNECT_SECONDS, read=READ_SECONDS)
    async with (
        httpx2.AsyncClient(transport=bounded, timeout=timeout) as client,
        streamable_http_client(
            entry.url, http_client=client, max_sse_event_size=entry.max_answer_bytes
        ) as streams,
    ):
        yield streams


class BoundedAnswers(httpx2.AsyncBaseTransport):
    """Asks for the server's SVID name at every handshake, and bounds every answer."""

    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport,
        *,
        server_name: str,
        limit: int,
        state: HttpState,
    ) -> None:
        self._inner = inner
        self._server_name = server_name
        self._limit = limit
        self._state = state

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request``; the answer's body counted as it is read."""
        if self._server_name:
            # httpcore2 checks the certificate against sni_hostname (check_hostname
            # stays on): the handshake proves the server's identity.
            request.extensions["sni_hostname"] = self._server_name
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        codings = response.headers.get("content-encoding", "identity").strip().lower()
        if codings not in ("", "identity"):
            await response.aclose()
            self._state.oversized = True
            raise AnswerTooLarge("the MCP server compressed its answer (identity was asked)")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Counted(response.stream, self._limit, self._state),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Close the inner transport's connections."""
        await self._inner.aclose()


class _Counted(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, state: HttpState) -> None:
        self._inner = inner
        self._limit = limit
        self._state = state

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                self._state.oversized = True
                raise AnswerTooLarge(f"the MCP server's answer exceeds {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
