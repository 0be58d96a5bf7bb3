"""One uvicorn server on the agent's event loop, on a socket bound here.

The agent owns the signals and the loop: uvicorn's ``serve()`` would install
its own signal handlers, so the server is driven by ``startup`` /
``main_loop`` / ``shutdown`` instead, on a socket bound here so that port 0
picks a port and the bound one is read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
from collections.abc import Callable
from typing import Any

import uvicorn

from gateway.errors import ConfigError

ASGIApp = Any


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port``, not yet listening (a name: its IPv4 address).

    ``reuse_port``: the agent's sibling workers bind the same port (``SO_REUSEPORT``).

    Raises:
        OSError: The address cannot be bound (in use, not ours, unresolvable).
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets
    # that say they are TCP, and the accepted ones inherit it. Without it every
    # response on a kept-alive connection waits ~40 ms for the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def endpoint_config(
    app: ASGIApp,
    protocol: type[asyncio.Protocol],
    tls: Callable[[], ssl.SSLContext] | None = None,
) -> uvicorn.Config:
    """uvicorn's settings for a small endpoint of ours (console, metrics).

    No logging setup of uvicorn's own (its records propagate to the process's
    handler), no access log, no ``Server`` or ``Date`` header, no proxy
    headers trusted, no WebSocket upgrade; ``tls`` builds the listening context
    (None: plain HTTP).
    """
    return uvicorn.Config(
        app,
        http=protocol,
        ws="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        ssl_context_factory=None if tls is None else (lambda _config, _default: tls()),
    )


class HttpListener:
    """Serves ``config``'s app on one socket of ours until :meth:`stop`.

    Attributes:
        host: The host bound (after :meth:`start`).
        port: The port bound (after :meth:`start`; 0 before).
    """

    def __init__(self, config: uvicorn.Config) -> None:
        self._config = config
        self._server = uvicorn.Server(config)
        self._sock: socket.socket | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.host = ""
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` bound (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Bind ``host:port`` (port 0 picks one) and serve; returns the bound port.

        ``reuse_port``: as for :func:`bind_socket`.

        Raises:
            OSError: The address cannot be bound.
            ConfigError: uvicorn would not start on it.
            ssl.SSLError: The listening context cannot be built.
        """
        self._sock = bind_socket(host, port, reuse_port=reuse_port)
        try:
            self._config.load()
            self._server.lifespan = self._config.lifespan_class(self._config)
            await self._server.startup(sockets=[self._sock])
            if self._server.should_exit:  # uvicorn logged why; nothing serves
                raise ConfigError(f"could not serve HTTP on {host}:{port}")
        except BaseException:
            self._sock.close()
            self._sock = None
            raise
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._loop_task = asyncio.create_task(self._server.main_loop())
        return self.port

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting; requests in flight have up to ``grace`` seconds (idempotent)."""
        if self._loop_task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task
        self._config.timeout_graceful_shutdown = max(1, round(grace))
        await self._server.shutdown(sockets=[self._sock] if self._sock else None)
        if self._sock is not None:
            self._sock.close()
        self._loop_task = None
