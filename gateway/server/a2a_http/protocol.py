"""uvicorn's h11 protocol, telling the app which client certificate the handshake verified.

uvicorn does not put the TLS peer into the ASGI scope. This protocol reads it
from the connection once the handshake is done (``connection_made`` runs
after it) and adds it to every request's scope as the ASGI TLS extension
(``gateway.http.connection.with_certificate``: PEM strings, leaf first).
Nothing a client sends can put it there: the app reads the certificate from
this key only (``client_certificate``), and ignores headers such as
``X-Forwarded-Client-Cert``. The scope also carries the connection's
``abort`` (``connection_abort``), so the edge can drop a connection whose
client stopped reading without waiting for its send buffer to drain.

A request with both ``Content-Length`` and ``Transfer-Encoding`` (h11 reads its
body by the transfer coding) is answered with ``Connection: close``, so the
connection closes after the answer (RFC 9112 6.1, "MUST close"): whatever sits
in front may have framed the body by its length, and what follows it on the
connection would be a smuggled request.

At shutdown an idle connection is closed as uvicorn closes it (TLS
close_notify), and dropped if it is still open ``IDLE_CLOSE_SECONDS`` later:
a client that never answers close_notify (a pooled connection nobody reads)
would otherwise hold the server's stop for its whole grace period.

Connections are bounded, so that nobody can hold the agent's file
descriptors: a connection whose request head is not complete
``HEAD_SECONDS`` after it opened (or after the first byte of its next
request) is dropped (uvicorn times out only idle kept-alive ones; the edge's
body deadline starts once the head is in); and a server holds at most
:class:`ConnectionBudget` connections, fewer of them without a client
certificate (those can only read the public card), so anonymous clients
cannot crowd out peers. A connection over the budget is dropped as soon as
its handshake is done, before it can send a request.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.http.connection import peer_certificate_pem, with_certificate

HEAD_SECONDS = 10.0
"""How long a request's head may take to arrive (from the connection's start, or from the
first byte of a later request on it) before the connection is dropped."""
MAX_CONNECTIONS = 4096
"""The most connections one HTTPS server holds, whatever the descriptor limit allows."""
IDLE_CLOSE_SECONDS = 0.5
"""How long an idle connection has, once shut down, to finish its TLS close before it is dropped."""


@dataclass
class ConnectionBudget:
    """How many connections one server holds open at once, and how many without a certificate.

    Attributes:
        most: Connections at once.
        most_anonymous: Of those, connections without a client certificate.
        open: Connections open now.
        anonymous: Of those, without a client certificate.
    """

    most: int
    most_anonymous: int
    open: int = 0
    anonymous: int = 0

    def take(self, anonymous: bool) -> bool:
        """Count one more connection; False (nothing counted) when it is over the budget."""
        if self.open >= self.most or (anonymous and self.anonymous >= self.most_anonymous):
            return False
        self.open += 1
        self.anonymous += anonymous
        return True

    def give_back(self, anonymous: bool) -> None:
        """A connection :meth:`take` counted has closed."""
        self.open -= 1
        self.anonymous -= anonymous


def connection_budget() -> ConnectionBudget:
    """Half the process's descriptor limit (the rest is the gRPC port's and the state
    files'), at most ``MAX_CONNECTIONS``; a quarter of that without a certificate."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else min(MAX_CONNECTIONS, soft // 2)
    most = max(most, 8)
    return ConnectionBudget(most, max(most // 4, 2))


class VerifiedPeerProtocol(H11Protocol):
    """``H11Protocol`` whose requests carry the connection's verified client certificate.

    ``budget`` (set on a subclass per server, see :func:`budgeted`) bounds the
    connections; None: unbounded (but every head still has its deadline).
    """

    budget: ClassVar[ConnectionBudget | None] = None
    _counted = False
    _anonymous = True
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Bind this connection's requests to the certificate its handshake verified."""
        super().connection_made(transport)
        pem = peer_certificate_pem(transport.get_extra_info("ssl_object"))
        self._anonymous = pem is None
        if self.budget is not None:
            if not self.budget.take(self._anonymous):
                transport.abort()  # over the budget: before it can send a request
                return
            self._counted = True
        self.app = _close_when_framed_twice(
            with_certificate(self.config.loaded_app, pem, transport.abort)
        )
        self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        """Give the connection's place back."""
        super().connection_lost(exc)
        self._stop_head_timer()
        if self._counted and self.budget is not None:
            self._counted = False
            self.budget.give_back(self._anonymous)

    def data_received(self, data: bytes) -> None:
        """Handle ``data``; a head still incomplete after it is timed from its first byte."""
        super().data_received(data)
        if not self._awaiting_head():
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _awaiting_head(self) -> bool:
        no_request = self.cycle is None or self.cycle.response_complete
        return no_request and not self.transport.is_closing()

    def _head_late(self) -> None:
        self._head_timer = None
        if self._awaiting_head():
            self.transport.abort()

    def shutdown(self) -> None:
        """Close this connection for the server's stop; an idle one is dropped if it lingers."""
        idle = self.cycle is None or self.cycle.response_complete
        super().shutdown()
        if idle:
            asyncio.get_running_loop().call_later(IDLE_CLOSE_SECONDS, self._drop_if_open)

    def _drop_if_open(self) -> None:
        if self in self.connections:  # connection_lost has not run: the close is not done
            self.transport.abort()


def budgeted(budget: ConnectionBudget) -> type[VerifiedPeerProtocol]:
    """:class:`VerifiedPeerProtocol` for one server, bounded by ``budget``."""
    return type("BudgetedPeerProtocol", (VerifiedPeerProtocol,), {"budget": budget})


def _close_when_framed_twice(app: Any) -> Any:
    """``app``, whose answer to a request framed by both length and chunks closes the connection."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        names = {name for name, _ in scope.get("headers", ())}
        if b"content-length" in names and b"transfer-encoding" in names:
            send = _closing(send)
        await app(scope, receive, send)

    return guarded


def _closing(send: Any) -> Any:
    """``send`` whose response says ``Connection: close`` (h11 then closes after it)."""

    async def closing(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing
