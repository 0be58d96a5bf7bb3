"""A minimal HTTP endpoint serving ``GET /metrics`` in the Prometheus text format.

Only what a Prometheus scraper needs: one request per connection, ``GET
/metrics`` answered 200, any other path 404, anything else 405. With a health
source it also answers ``/healthz`` and ``/readyz`` (``health_http``). It binds the
configured address only (loopback unless ``[metrics] allow_remote``); on loopback
it answers only a ``Host`` that names this machine (an IP literal or ``localhost``;
``421`` otherwise), so a page whose name an attacker points at 127.0.0.1 (DNS
rebinding) cannot read the metrics, as for the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gateway.config.addresses import names_this_machine
from gateway.errors import GatewayError
from gateway.telemetry.health_http import HEALTH_PATHS, TEXT, HealthSource, health_answer
from gateway.telemetry.prometheus_text import CONTENT_TYPE

_log = logging.getLogger(__name__)
_MAX_HEADER_BYTES = 16 * 1024
_READ_TIMEOUT = 5.0


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` on ``host:port`` (port 0 picks one)."""

    def __init__(self, listen: str, render: Callable[[], str], *, any_host: bool = False) -> None:
        """``any_host``: answer whatever ``Host`` a request names (``allow_remote``)."""
        host, _, port = listen.rpartition(":")
        self._host = host.strip("[]")
        self._port = int(port)
        self._render = render
        self._any_host = any_host
        self._server: asyncio.Server | None = None
        self.port = 0
        self.health: HealthSource | None = None
        """Answers /healthz and /readyz when set (the agent sets it)."""

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
            self._server = await asyncio.start_server(self._serve, self._host, self._port)
        except OSError as err:
            raise GatewayError(
                f"metrics: cannot listen on {self._host}:{self._port}: {err}"
            ) from err
        self.port = int(self._server.sockets[0].getsockname()[1])
        _log.info("serving metrics on %s/metrics", self.address)
        return self.port

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            status, body, kind = self._answer(head)
        except ConnectionError:  # the client went (a reset): nobody to answer, nothing failed
            writer.close()
            return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, body, kind = "400 Bad Request", "", CONTENT_TYPE
        except Exception:  # a broken render must not take the endpoint down
            _log.exception("metrics: rendering failed")
            status, body, kind = "500 Internal Server Error", "", CONTENT_TYPE
        payload = body.encode("utf-8")
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode("ascii")
            + payload
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    def _answer(self, head: bytes) -> tuple[str, str, str]:
        if len(head) > _MAX_HEADER_BYTES:
            return "431 Request Header Fields Too Large", "", CONTENT_TYPE
        first, *fields = head.decode("latin-1").split("\r\n")
        method, _, rest = first.partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if not self._any_host:
            hosts = [
                v.strip()
                for n, _, v in (f.partition(":") for f in fields)
                if n.strip().lower() == "host"
            ]
            if len(hosts) > 1:
                return "400 Bad Request", "", TEXT
            if hosts and not names_this_machine(hosts[0]):  # no Host: not a browser
                return "421 Misdirected Request", "", TEXT
        if method != "GET":
            return "405 Method Not Allowed", "", CONTENT_TYPE
        if path in HEALTH_PATHS and self.health is not None:
            return (*health_answer(path, self.health), TEXT)
        if path != "/metrics":
            return "404 Not Found", "", CONTENT_TYPE
        return "200 OK", self._render(), CONTENT_TYPE
