"""The little HTTP/1.1 the console needs: read one GET, write one answer with strict headers.

One request per connection (``Connection: close``); a server-sent event
stream keeps its connection until the client or the server ends it. Every
answer carries the same security headers: a Content-Security-Policy that
allows only this origin (no inline script or style, no frames, no other
origin to connect to), ``nosniff``, no referrer, and no caching.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT = 10.0
MAX_FIELDS = 20
"""Query parameters a request may carry (a page reads five)."""
DRAIN_TIMEOUT = 10.0
"""Seconds a client may take to accept what was written before it is dropped."""

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"


class BadRequest(Exception):
    """The request cannot be read (answered 400 or 431, never passed on)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    """One GET: its path and its query parameters (the last value of each name)."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    host: str | None = None
    """The ``Host`` header (None when the request has none)."""
    last_event_id: str | None = None
    """The ``Last-Event-ID`` header of a reconnecting event stream (None: none)."""

    def param(self, name: str) -> str:
        """The query parameter ``name``, stripped (``""`` when absent)."""
        return self.query.get(name, "").strip()


async def read_request(reader: asyncio.StreamReader) -> Request:
    """Read one request head.

    Raises:
        BadRequest: Not a complete HTTP/1.x request head within the limits.
    """
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    except asyncio.LimitOverrunError:
        raise BadRequest("431 Request Header Fields Too Large") from None
    except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
        raise BadRequest("400 Bad Request") from None
    if len(head) > MAX_HEAD_BYTES:
        raise BadRequest("431 Request Header Fields Too Large")
    first, *fields = head[:-4].decode("latin-1").split("\r\n")
    words = first.split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        raise BadRequest("400 Bad Request")
    headers: dict[str, list[str]] = {}
    for name, _, value in (f.partition(":") for f in fields):
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    hosts, resume = headers.get("host", []), headers.get("last-event-id", [])
    if len(hosts) > 1:
        raise BadRequest("400 Bad Request")
    target = urlsplit(words[1])
    try:
        query = dict(parse_qsl(target.query, keep_blank_values=False, max_num_fields=MAX_FIELDS))
    except ValueError:  # more than MAX_FIELDS parameters
        raise BadRequest("400 Bad Request") from None
    return Request(
        words[0],
        target.path or "/",
        query,
        hosts[0] if hosts else None,
        resume[-1] if resume else None,
    )


def response_head(status: str, content_type: str, length: int | None) -> bytes:
    """Status line and headers; ``length`` None for a stream (no Content-Length)."""
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}"]
    lines += [f"{name}: {value}" for name, value in SECURITY_HEADERS]
    lines.append("Connection: close" if length is not None else "Connection: keep-alive")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


async def respond(
    writer: asyncio.StreamWriter, status: str, content_type: str, body: str | bytes
) -> None:
    """Write one whole answer and close the connection."""
    payload = body.encode("utf-8") if isinstance(body, str) else body
    writer.write(response_head(status, content_type, len(payload)) + payload)
    await close_quietly(writer)


async def drain(writer: asyncio.StreamWriter) -> None:
    """Wait until the client takes what was written.

    Raises:
        TimeoutError: It took nothing for ``DRAIN_TIMEOUT`` seconds (a stalled
            client must not hold its connection for as long as TCP would).
        ConnectionError: It went away.
    """
    await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT)


async def close_quietly(writer: asyncio.StreamWriter) -> None:
    """Flush and close; a client that went away, or stalls, is not an error."""
    try:
        await drain(writer)
    except TimeoutError:
        writer.transport.abort()  # close() would wait for the unsent bytes
    except (ConnectionError, OSError):
        pass
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()
