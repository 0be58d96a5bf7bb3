"""The HTTPS server of the A2A HTTP bindings: uvicorn on our own socket, TLS from ``LiveTls``.

uvicorn serves the edge's app with :class:`VerifiedPeerProtocol` (so
requests carry the verified client certificate, and connections are bounded
in number and in how long a request head may take) and the listening
context of :class:`LiveServerContext` (so each handshake uses the
certificate in force), on a listener of ``gateway.http`` (our socket, on the
agent's event loop, driven without uvicorn's signal handlers). With
``workers > 1`` every worker runs one of these on the one port
(``SO_REUSEPORT``), each with its own connection budget.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import uvicorn

from gateway.errors import AddressUnavailable, ConfigError
from gateway.http.listener import HttpListener
from gateway.server.a2a_http.protocol import budgeted, connection_budget
from gateway.server.a2a_http.tls import LiveServerContext
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 30
"""How long an idle connection stays open. Longer than the idle timeouts of the usual
clients' pools (httpx 5 s, undici 4 s), so a client never sends a request on a
connection the server is closing (uvicorn's 5 s default equals httpx's: a race)."""


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) → (host, port); ConfigError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"a2a.http_listen {address!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class A2AHttpServer:
    """Serves one ASGI app over HTTPS; the client certificate is requested, verified if sent."""

    def __init__(self, app: Any, material: TlsMaterial) -> None:
        self._tls = LiveServerContext(material)
        self.budget = connection_budget()
        """The connections this server holds, and their bounds."""
        self._config = uvicorn.Config(
            app,
            http=budgeted(self.budget),
            lifespan="off",
            # No logging config of uvicorn's own: its records propagate to the
            # process's handler (JSON or escaped text), not to a stderr handler of its own.
            log_config=None,
            log_level="warning",
            access_log=False,
            ssl_context_factory=self._context,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
        self._listener = HttpListener(self._config)

    @property
    def host(self) -> str:
        """The host bound (after start)."""
        return self._listener.host

    @property
    def port(self) -> int:
        """The port bound (after start; 0 before)."""
        return self._listener.port

    def _context(self, _config: uvicorn.Config, _default: Any) -> ssl.SSLContext:
        return self._tls.listening

    def use_tls(self, material: TlsMaterial) -> None:
        """New handshakes use ``material`` (a rotated certificate or CA)."""
        self._tls.use(material)

    async def start(self, address: str, *, reuse_port: bool = False) -> int:
        """Bind ``HOST:PORT`` (port 0 picks one) and serve; returns the bound port.

        ``reuse_port``: sibling worker processes share the port (``SO_REUSEPORT``;
        see :mod:`gateway.runtime.supervisor`), each with its own connection budget.
        A start that fails leaves no socket open.

        Raises:
            ConfigError: ``address`` is not ``HOST:PORT``, or uvicorn would not start.
            AddressUnavailable: the address cannot be bound.
        """
        host, port = split_host_port(address)
        try:
            await self._listener.start(host, port, reuse_port=reuse_port)
        except OSError as err:
            raise AddressUnavailable(
                f"could not listen on {host}:{port} for A2A over HTTPS: {err}"
            ) from err
        _log.info("serving A2A JSON-RPC and HTTP+JSON over HTTPS on port %d", self.port)
        return self.port

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace`` seconds."""
        await self._listener.stop(grace)
