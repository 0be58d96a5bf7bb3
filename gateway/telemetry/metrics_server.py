"""The HTTP endpoint serving ``GET /metrics`` in the Prometheus text format.

Only what a Prometheus scraper needs: ``GET /metrics`` answered 200, any other
path 404, any other method 405; one request per connection. With a health
source it also answers ``/healthz`` and ``/readyz`` (``health_http``). It binds
the configured address only (loopback unless ``[metrics] allow_remote``); on
loopback it answers only a ``Host`` that names this machine (an IP literal or
``localhost``; ``421`` otherwise), so a page whose name an attacker points at
127.0.0.1 (DNS rebinding) cannot read the metrics, as for the console.
Starlette on uvicorn (``gateway.http``), on the agent's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import AddressUnavailable
from gateway.http.connection import bounded
from gateway.http.guards import GetOnly, LoopbackHostGuard
from gateway.http.listener import HttpListener, endpoint_config
from gateway.telemetry.health_http import HEALTH_PATHS, TEXT, HealthSource, health_answer
from gateway.telemetry.prometheus_text import CONTENT_TYPE

_log = logging.getLogger(__name__)
HEAD_SECONDS = 5.0
"""How long a scraper may take to send its request head."""
MAX_CONNECTIONS = 64
"""Connections open at once (a scraper or two, probes); more are dropped unanswered."""


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` on ``host:port`` (port 0 picks one)."""

    def __init__(self, listen: str, render: Callable[[], str], *, any_host: bool = False) -> None:
        """``any_host``: answer whatever ``Host`` a request names (``allow_remote``)."""
        host, _, port = listen.rpartition(":")
        self._host = host.strip("[]")
        self._port = int(port)
        self._render = render
        guards = [Middleware(GetOnly, media_type=CONTENT_TYPE)]
        if not any_host:
            guards.insert(0, Middleware(LoopbackHostGuard))
        app = Starlette(
            routes=[Route(path, self._answer) for path in ("/metrics", *sorted(HEALTH_PATHS))],
            middleware=guards,
            exception_handlers={404: _not_found},
        )
        self._listener = HttpListener(endpoint_config(app, bounded(MAX_CONNECTIONS, HEAD_SECONDS)))
        self.health: HealthSource | None = None
        """Answers /healthz and /readyz when set (the agent sets it)."""

    @property
    def port(self) -> int:
        """The port bound (0 before start)."""
        return self._listener.port

    @property
    def address(self) -> str:
        """``host:port`` actually bound (after start)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self.port}"

    async def start(self) -> int:
        """Bind and serve; returns the bound port.

        Raises:
            GatewayError: The address cannot be bound.
        """
        try:
            await self._listener.start(self._host, self._port)
        except OSError as err:
            raise AddressUnavailable(
                f"metrics: cannot listen on {self._host}:{self._port}: {err}"
            ) from err
        _log.info("serving metrics on %s/metrics", self.address)
        return self.port

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        await self._listener.stop()

    async def _answer(self, request: Request) -> Response:
        path = request.scope["path"]
        if path in HEALTH_PATHS:
            if self.health is None:
                return await _not_found(request, None)
            status, body = health_answer(path, self.health)
            return Response(body, int(status.split(" ", 1)[0]), media_type=TEXT)
        try:
            text = self._render()
        except Exception:  # a broken render must not take the endpoint down
            _log.exception("metrics: rendering failed")
            return Response(b"", 500, media_type=CONTENT_TYPE)
        return Response(text, 200, media_type=CONTENT_TYPE)


async def _not_found(_request: Request, _exc: object) -> Response:
    return Response(b"", 404, media_type=CONTENT_TYPE)
