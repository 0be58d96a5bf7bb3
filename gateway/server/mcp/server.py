"""The HTTPS listener of ``[mcp] listen``: the A2A HTTPS server's TLS, protocol and bounds.

MCP is served on a listener of its own, not on the A2A HTTPS port, so that it
works with ``workers = N`` (each worker binds the one fixed port with
``SO_REUSEPORT``, as the gRPC port), its connections have a budget of their
own, and an operator can enable, expose or firewall it alone. Everything else
is the A2A HTTPS server's: the listening context that hands each handshake the
certificate in force (:class:`~gateway.server.a2a_http.tls.LiveServerContext`:
rotation without rebinding), the uvicorn protocol that puts the verified client
certificate into every request's scope and bounds connections and request heads
(:mod:`~gateway.server.a2a_http.protocol`, with a response's writes joined:
:mod:`~gateway.server.mcp.protocol`), and a listener of ``gateway.http`` on
the agent's event loop.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import uvicorn

from gateway.errors import AddressUnavailable
from gateway.http.listener import HttpListener
from gateway.server.a2a_http.protocol import ConnectionBudget, connection_budget
from gateway.server.a2a_http.server import KEEP_ALIVE_SECONDS, split_host_port
from gateway.server.a2a_http.tls import LiveServerContext
from gateway.server.mcp.protocol import joined_budgeted
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)


class McpHttpsServer:
    """Serves the MCP edge over HTTPS; the client certificate is requested, verified if sent."""

    def __init__(self, app: Any, material: TlsMaterial) -> None:
        self._tls = LiveServerContext(material)
        self.budget: ConnectionBudget = connection_budget()
        """The connections this server holds, and their bounds."""
        config = uvicorn.Config(
            app,
            http=joined_budgeted(self.budget),
            ws="none",
            lifespan="off",
            log_config=None,  # uvicorn's records propagate to the process's handler
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            ssl_context_factory=self._context,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
        self._listener = HttpListener(config)

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
        """Bind ``HOST:PORT`` and serve; returns the bound port (a failed start binds nothing).

        Raises:
            AddressUnavailable: the address cannot be bound.
        """
        host, port = split_host_port(address)
        try:
            await self._listener.start(host, port, reuse_port=reuse_port)
        except OSError as err:
            raise AddressUnavailable(
                f"could not listen on {host}:{port} for MCP over HTTPS: {err}"
            ) from err
        _log.info("serving MCP (Streamable HTTP) over HTTPS on port %d", self.port)
        return self.port

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting; requests in flight have up to ``grace`` seconds."""
        await self._listener.stop(grace)
