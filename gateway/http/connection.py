"""uvicorn's httptools protocol with bounded connections and the verified client certificate.

Every connection of a listener built with :func:`bounded`:

- answers one request and closes (``Connection: close``): an endpoint of
  ours is read by a browser page, a scraper or a probe, never by a pool that
  would profit from keeping it;
- has ``head_seconds`` to send its request head (from the connection's start
  or the head's first byte) and at most :data:`MAX_HEAD_BYTES` of it, else
  it is answered 400 (too slow) or 431 (too large) and closed, so a client
  that sends a byte at a time (slowloris) cannot keep it;
- counts against the listener's :class:`ConnectionLimit`: one over it is
  dropped before it can send a request.

uvicorn does not put the TLS peer into the ASGI scope. This protocol reads
it once the handshake is done (``connection_made`` runs after it) and adds
it to every request's scope as the ASGI TLS extension
(``scope["extensions"]["tls"]["client_cert_chain"]``, PEM, leaf first),
replacing whatever was there: nothing a client sends can put it there. The
scope also carries the connection's ``abort`` (:func:`connection_abort`), so
an app can drop a client that stopped reading without waiting for its send
buffer to drain.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ASGIApp = Any
MAX_HEAD_BYTES = 16 * 1024
"""The largest request head (request line and headers) a connection may send."""
ABORT_KEY = "a2agw.abort"
"""Where a request's scope holds its connection's ``abort`` (drop it and its send buffer now)."""
TEXT = "text/plain; charset=utf-8"


def peer_certificate_pem(ssl_object: ssl.SSLObject | None) -> bytes | None:
    """The client certificate the handshake verified, as PEM (None if none was sent)."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return ssl.DER_cert_to_PEM_cert(der).encode("ascii")


def client_certificate(scope: Mapping[str, Any]) -> bytes | None:
    """The verified client certificate (PEM) of the request's connection, or None."""
    tls = scope.get("extensions", {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or []
    return chain[0].encode("ascii") if len(chain) >= 1 else None


def connection_abort(scope: Mapping[str, Any]) -> Callable[[], None] | None:
    """``abort`` of the request's connection (None outside a protocol that sets it)."""
    abort: Callable[[], None] | None = scope.get(ABORT_KEY)
    return abort


def _head_size(scope: Mapping[str, Any]) -> int:
    """About the bytes of the request head (target and headers) the scope was parsed from."""
    fields = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
    return len(scope["raw_path"]) + len(scope["query_string"]) + fields


def with_certificate(app: ASGIApp, pem: bytes | None, abort: Callable[[], None]) -> ASGIApp:
    """``app`` with the connection's verified certificate and ``abort`` in every scope."""
    chain = [pem.decode("ascii")] if pem is not None else []

    async def bound(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Replaced, never merged: whatever was there did not come from this handshake.
        scope["extensions"] = {**scope.get("extensions", {}), "tls": {"client_cert_chain": chain}}
        scope[ABORT_KEY] = abort
        await app(scope, receive, send)

    return bound


def _head_bounded(app: ASGIApp) -> ASGIApp:
    """``app`` behind a 431 for a head over :data:`MAX_HEAD_BYTES` that came whole in one
    read (so the byte count of :class:`BoundedHttpProtocol` did not stop it)."""

    async def bounded_head(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _head_size(scope) > MAX_HEAD_BYTES:
            await Response(b"", 431, media_type=TEXT)(scope, receive, send)
            return
        await app(scope, receive, send)

    return bounded_head


@dataclass
class ConnectionLimit:
    """How many connections one listener holds open at once.

    Attributes:
        most: Connections at once.
        open: Connections open now.
    """

    most: int
    open: int = 0

    def take(self) -> bool:
        """Count one more connection; False (nothing counted) when it is over the limit."""
        if self.open >= self.most:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        """A connection :meth:`take` counted has closed."""
        self.open -= 1


class BoundedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with the bounds above (set per listener by :func:`bounded`)."""

    limit: ClassVar[ConnectionLimit] = ConnectionLimit(0)
    head_seconds: ClassVar[float] = 10.0
    _counted = False
    _head_bytes = 0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection (or drop it), bind its certificate, start the head's clock."""
        super().connection_made(transport)
        if not self.limit.take():
            transport.abort()  # over the limit: before it can send a request
            return
        self._counted = True
        pem = peer_certificate_pem(transport.get_extra_info("ssl_object"))
        self.app = with_certificate(_head_bounded(self.config.loaded_app), pem, transport.abort)
        self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        """Give the connection's place back."""
        super().connection_lost(exc)
        self._stop_head_timer()
        if self._counted:
            self._counted = False
            self.limit.give_back()

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; a head still incomplete is timed from its first byte and sized."""
        if self._awaiting_head():
            self._head_bytes += len(data)
        super().data_received(data)
        if not self._awaiting_head():
            self._head_bytes = 0
            self._stop_head_timer()
        elif self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(b"431 Request Header Fields Too Large")
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def on_headers_complete(self) -> None:
        """Start the request as one that closes its connection once answered."""
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.keep_alive = False

    def _awaiting_head(self) -> bool:
        no_request = self.cycle is None or self.cycle.response_complete
        return no_request and not self.transport.is_closing()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._awaiting_head():
            self._refuse(b"400 Bad Request")

    def _refuse(self, status: bytes) -> None:
        self._stop_head_timer()
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: 0\r\nconnection: close\r\n\r\n"
        )
        self.transport.close()


def bounded(most: int, head_seconds: float) -> type[BoundedHttpProtocol]:
    """:class:`BoundedHttpProtocol` for one listener: ``most`` connections at once."""
    return type(
        "ListenerProtocol",
        (BoundedHttpProtocol,),
        {"limit": ConnectionLimit(most), "head_seconds": head_seconds},
    )
