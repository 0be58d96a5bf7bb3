"""uvicorn's h11 protocol, telling the app which client certificate the handshake verified.

uvicorn does not put the TLS peer into the ASGI scope. This protocol reads it
from the connection once the handshake is done (``connection_made`` runs
after it) and adds it to every request's scope as the ASGI TLS extension
(``scope["extensions"]["tls"]["client_cert_chain"]``, PEM strings, leaf
first). Nothing a client sends can put it there: the app reads the
certificate from this key only, and ignores headers such as
``X-Forwarded-Client-Cert``. The scope also carries the connection's
``abort`` (:data:`ABORT_KEY`), so the edge can drop a connection whose
client stopped reading without waiting for its send buffer to drain.

At shutdown an idle connection is closed as uvicorn closes it (TLS
close_notify), and dropped if it is still open ``IDLE_CLOSE_SECONDS`` later:
a client that never answers close_notify (a pooled connection nobody reads)
would otherwise hold the server's stop for its whole grace period.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.server.a2a_http.tls import peer_certificate_pem

ASGIApp = Any
IDLE_CLOSE_SECONDS = 0.5
"""How long an idle connection has, once shut down, to finish its TLS close before it is dropped."""
ABORT_KEY = "a2agw.abort"
"""Where a request's scope holds its connection's ``abort`` (drop it and its send buffer now)."""


def client_certificate(scope: Mapping[str, Any]) -> bytes | None:
    """The verified client certificate (PEM) of the request's connection, or None."""
    tls = scope.get("extensions", {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or []
    return chain[0].encode("ascii") if len(chain) >= 1 else None


def connection_abort(scope: Mapping[str, Any]) -> Callable[[], None] | None:
    """``abort`` of the request's connection (None outside :class:`VerifiedPeerProtocol`)."""
    abort: Callable[[], None] | None = scope.get(ABORT_KEY)
    return abort


def _with_certificate(app: ASGIApp, pem: bytes | None, abort: Callable[[], None]) -> ASGIApp:
    chain = [pem.decode("ascii")] if pem is not None else []

    async def bound(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Replaced, never merged: whatever was there did not come from this handshake.
        scope["extensions"] = {**scope.get("extensions", {}), "tls": {"client_cert_chain": chain}}
        scope[ABORT_KEY] = abort
        await app(scope, receive, send)

    return bound


class VerifiedPeerProtocol(H11Protocol):
    """``H11Protocol`` whose requests carry the connection's verified client certificate."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Bind this connection's requests to the certificate its handshake verified."""
        super().connection_made(transport)
        self.app = _with_certificate(
            self.config.loaded_app,
            peer_certificate_pem(transport.get_extra_info("ssl_object")),
            transport.abort,
        )

    def shutdown(self) -> None:
        """Close this connection for the server's stop; an idle one is dropped if it lingers."""
        idle = self.cycle is None or self.cycle.response_complete
        super().shutdown()
        if idle:
            asyncio.get_running_loop().call_later(IDLE_CLOSE_SECONDS, self._drop_if_open)

    def _drop_if_open(self) -> None:
        if self in self.connections:  # connection_lost has not run: the close is not done
            self.transport.abort()
