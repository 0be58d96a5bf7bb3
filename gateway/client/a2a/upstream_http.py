"""The HTTP answers of a JSON-RPC upstream: bounded, decoded within the bound, checked.

Every answer is read here, below the SDK, and handed on only if it is at most
``MESSAGE_CEILING`` bytes *as the SDK will read it*: requests ask for
``Accept-Encoding: identity``, and an upstream that compresses anyway has its
``gzip``/``deflate`` layers inflated here with the output capped while
inflating (a 40 KB gzip body inflating to 40 MiB stops at the ceiling, never
allocating more). Any other content coding (``br``, ``zstd``, unknown) is
refused rather than handed to httpx, whose decoders have no such cap. A
successful (2xx) answer must also be shaped like a JSON-RPC response (see
``upstream_answers``; a streaming call's answer read whole, like one stream
event, as the SDK parses it). A 2xx ``text/event-stream`` answering a call
that asked for a stream is the exception: it is handed on as it arrives, each
event bounded and checked (``upstream_sse``, which also refuses a stream no
call asked for and a media type the SDK would read otherwise, before any of
the body is read). Every refusal is ``UnreadableAnswer``: INVALID_OUTPUT.
"""

from __future__ import annotations

import zlib
from typing import Any

import httpx

from gateway.client.a2a.upstream_answers import UnreadableAnswer, check_jsonrpc_answer
from gateway.client.a2a.upstream_sse import (
    CheckedEventStream,
    asks_for_stream,
    check_stream_event,
    is_streamed,
)
from gateway.transport.tls import MESSAGE_CEILING

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip header and trailer
_ZLIB_WBITS = zlib.MAX_WBITS  # RFC 9110 "deflate": zlib-wrapped
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS  # what some servers send as "deflate"
_MAX_CODINGS = 2  # stacked layers accepted ("gzip, gzip"); each is capped anyway


class CheckedResponse(httpx.Response):
    """An answer whose JSON its check already parsed: ``json()`` hands that object on.

    The SDK reads every answer with ``json()``; without this a large answer
    was parsed twice (once here to check its shape, once by the SDK). Only a
    checked (2xx) answer carries one; any other, or ``json()`` with options,
    is parsed as usual.
    """

    def __init__(self, *args: Any, parsed: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsed = parsed

    def json(self, **kwargs: Any) -> Any:
        """The parsed answer (parsed again only without one, or with options)."""
        if self._parsed is None or kwargs:
            return super().json(**kwargs)
        return self._parsed


class BoundedTransport(httpx.AsyncBaseTransport):
    """Answers of at most ``limit`` decoded bytes, checked (see the module doc).

    Optionally, every TLS handshake asks for ``server_name`` (SNI) instead of
    the URL's host; the identity is checked by the TLS context (its SPIFFE ID
    pinned by ``gateway.client.pinned_tls``), never by a host name.
    """

    def __init__(
        self,
        inner: httpx.AsyncHTTPTransport,
        *,
        server_name: str = "",
        limit: int = MESSAGE_CEILING,
    ) -> None:
        self._inner = inner
        self._server_name = server_name
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the whole answer, decoded and checked.

        Raises:
            UnreadableAnswer: the answer is too large, in an unsupported
                encoding, (2xx) not a JSON-RPC response, or a stream the call
                did not ask for or with an ambiguous media type.
        """
        if self._server_name:
            # SNI only: the context checks no host name, it pins the SPIFFE ID.
            request.extensions["sni_hostname"] = self._server_name
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        try:
            streamed = is_streamed(request, response)
        except UnreadableAnswer:
            await response.aclose()  # nothing of the body is read
            raise
        if streamed:
            return await self._event_stream(response)
        try:
            raw = await self._read(response)
        finally:
            await response.aclose()
        codings = response.headers.get_list("content-encoding", split_commas=True)
        body = decoded(raw, codings, self._limit)
        parsed = None
        if 200 <= response.status_code < 300:
            check = check_stream_event if asks_for_stream(request) else check_jsonrpc_answer
            parsed = check(body)
        headers = [
            (name, value)
            for name, value in response.headers.multi_items()
            if name.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return CheckedResponse(
            response.status_code,
            headers=headers,
            content=body,
            extensions=response.extensions,
            parsed=parsed,
        )

    async def _event_stream(self, response: httpx.Response) -> httpx.Response:
        """A streamed answer, handed on as it comes, each event checked (``upstream_sse``)."""
        codings = response.headers.get_list("content-encoding", split_commas=True)
        if any(c.strip().lower() not in ("", "identity") for c in codings):
            await response.aclose()
            raise UnreadableAnswer("the upstream's stream has a content coding")
        if (response.charset_encoding or "utf-8").lower() not in ("utf-8", "utf8"):
            # SSE is UTF-8; the SDK would decode another charset into other events
            # than the ones upstream_sse checks.
            await response.aclose()
            raise UnreadableAnswer("the upstream's stream is not UTF-8")
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=CheckedEventStream(response.stream),
            extensions=response.extensions,
        )

    async def _read(self, response: httpx.Response) -> bytes:
        body = bytearray()
        async for chunk in response.stream:  # type: ignore[union-attr]
            body += chunk
            if len(body) > self._limit:
                raise UnreadableAnswer("the upstream's answer exceeds the size limit")
        return bytes(body)

    async def aclose(self) -> None:
        """Close the inner transport's connections."""
        await self._inner.aclose()


def decoded(raw: bytes, codings: list[str], limit: int) -> bytes:
    """``raw`` with its content codings undone, never more than ``limit`` bytes.

    Raises:
        UnreadableAnswer: a coding other than identity/gzip/deflate, too many
            layers, a corrupt or truncated layer, or more than ``limit`` bytes.
    """
    layers = [c.strip().lower() for c in codings if c.strip().lower() not in ("", "identity")]
    if len(layers) > _MAX_CODINGS:
        raise UnreadableAnswer("the upstream's answer has too many content codings")
    if len(raw) > limit:
        raise UnreadableAnswer("the upstream's answer exceeds the size limit")
    body = raw
    for coding in reversed(layers):  # the last coding applied is the first undone
        try:
            if coding in ("gzip", "x-gzip"):
                body = _inflate(body, _GZIP_WBITS, limit)
            elif coding == "deflate":
                body = _inflate_deflate(body, limit)
            else:
                raise UnreadableAnswer("the upstream's answer has an unsupported content coding")
        except zlib.error as err:
            raise UnreadableAnswer("the upstream's answer is a corrupt encoding") from err
    return body


def _inflate_deflate(data: bytes, limit: int) -> bytes:
    try:
        return _inflate(data, _ZLIB_WBITS, limit)
    except zlib.error:
        return _inflate(data, _RAW_DEFLATE_WBITS, limit)


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """Inflate one layer, producing at most ``limit + 1`` bytes before refusing."""
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(data, limit + 1)  # raises zlib.error if corrupt
    if len(out) > limit or inflater.unconsumed_tail:
        raise UnreadableAnswer("the upstream's answer exceeds the size limit once decoded")
    if not inflater.eof or inflater.unused_data:
        raise UnreadableAnswer("the upstream's answer is a truncated or corrupt encoding")
    return out
