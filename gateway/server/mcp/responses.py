"""Writing MCP answers on the HTTP response: one JSON body, or an event stream.

A request is answered with ``application/json`` unless the client asked for
progress (a ``progressToken``) and accepts ``text/event-stream``: then the
answer is a stream of ``message`` events, the progress notifications first and
the JSON-RPC response last. Both are Streamable HTTP's own forms.

Every write of a stream waits at most ``send_timeout`` seconds for the client
to read; a client that reads nothing for longer has its connection dropped at
once (with what was buffered for it), so it holds no connection or buffer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from starlette.types import Scope, Send

from gateway.http.connection import connection_abort

_log = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


class StreamDropped(Exception):
    """The client read nothing for ``send_timeout`` seconds: its connection was dropped."""


def response_body(request_id: Any, result: dict[str, Any]) -> bytes:
    """A JSON-RPC response."""
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def error_body(request_id: Any, error: dict[str, Any]) -> bytes:
    """A JSON-RPC error response (``id`` null when the request's id is not known)."""
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


async def send_json(
    send: Send, body: bytes, status: int = 200, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """One whole ``application/json`` response (``extra``: more headers)."""
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_empty(send: Send, status: int, headers: list[tuple[bytes, bytes]] = []) -> None:  # noqa: B006
    """A response without a body (``202`` for a notification, ``405``)."""
    all_headers = [*headers, (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_event(message: dict[str, Any] | bytes) -> bytes:
    """One ``message`` event holding a JSON-RPC message."""
    data = message if isinstance(message, bytes) else orjson.dumps(message)
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


class EventStream:
    """A response of ``message`` events, opened by the first one sent, each write bounded."""

    def __init__(self, scope: Scope, send: Send, send_timeout: float) -> None:
        self._scope = scope
        self._send = send
        self._timeout = send_timeout
        self.started = False
        self.dropped = False

    async def event(self, message: dict[str, Any] | bytes, *, last: bool = False) -> None:
        """Send one event (``last``: and end the response).

        Raises:
            StreamDropped: the client did not read it in time (the connection is gone).
        """
        if self.dropped:
            raise StreamDropped
        if not self.started:
            self.started = True
            await self._bounded(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
            )
        await self._bounded(
            {"type": "http.response.body", "body": sse_event(message), "more_body": not last}
        )

    async def _bounded(self, message: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._send(message)
        except TimeoutError as err:
            self.dropped = True
            _log.warning(
                "dropped an MCP event stream: its client read nothing for %g s", self._timeout
            )
            abort = connection_abort(self._scope)
            if abort is not None:
                abort()
            raise StreamDropped from err
