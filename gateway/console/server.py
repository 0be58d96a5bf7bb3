"""The console's own listener in the agent process: pages, live events, health, static files.

Loopback plain HTTP by default. With ``[console] allow_remote = true`` it
speaks TLS with the agent's certificate and admits only a client
certificate from the agent's CA whose SPIFFE ID is in ``operators``
(anything else: the handshake fails, or 403). Read-only: only GET.
A Starlette app on uvicorn (``gateway.http``), on the agent's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.audit.record import AuditRecord
from gateway.config import ConsoleSettings, TlsFiles
from gateway.console import http, live, status_views, views
from gateway.console.http import (
    HTML,
    AnswerFailures,
    BoundedQuery,
    OperatorsOnly,
    Query,
    SecurityHeaders,
    text,
)
from gateway.console.live import LiveDecisions, event_data
from gateway.console.pages import layout, problem_note
from gateway.errors import AddressUnavailable, AgentConfigError, ConfigError
from gateway.http.connection import bounded, connection_abort
from gateway.http.guards import GetOnly, LoopbackHostGuard
from gateway.http.listener import HttpListener, endpoint_config
from gateway.telemetry.health_http import HEALTH_PATHS, health_answer

_log = logging.getLogger(__name__)
KEEPALIVE_SECONDS = 15.0
MAX_STREAMS = 32
"""Live pages open at once; more are answered 503 (each holds a connection and a queue)."""
MAX_CONNECTIONS = 128
"""Connections open at once (live pages, the page loads beside them); more are dropped."""
HEAD_SECONDS = 10.0
"""How long a client may take to send its request head."""
_STATIC = {
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}
_PAGES: dict[str, tuple[str, Callable[[views.ConsoleSource, Query], Awaitable[str] | str]]] = {
    "/": ("Live decisions", views.decisions),
    "/refusals": ("Refusals by peer and reason", views.refusals),
    "/grants": ("Grants", lambda source, _: status_views.grants(source)),
    "/certificate": ("Certificate", lambda source, _: status_views.certificate(source)),
    "/upstreams": ("Upstream agents", lambda source, _: status_views.upstreams(source)),
    "/audit": ("Audit chain and checkpoints", status_views.audit_status),
    "/tasks": ("Calls and A2A tasks in flight", lambda source, _: status_views.in_flight(source)),
}
_REFRESH_SECONDS = {"/tasks": 5}
"""Pages the browser loads again by itself (calls in flight change by the second)."""
_MISDIRECTED = "this console answers only requests for its own address\n"


class ConsoleServer:
    """Serves the console of one agent (``start`` after the audit log is open)."""

    def __init__(self, settings: ConsoleSettings, source: views.ConsoleSource) -> None:
        self._settings = settings
        self._source = source
        host, _, port = settings.listen.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._live = LiveDecisions(source.config)
        self._live_pages = LivePages(self._live)
        tls = self._tls if settings.allow_remote else None
        protocol = bounded(MAX_CONNECTIONS, HEAD_SECONDS)
        self._listener = HttpListener(endpoint_config(self._app(), protocol, tls))
        self._started = False

    @property
    def port(self) -> int:
        """The port bound (0 before start)."""
        return self._listener.port

    @property
    def address(self) -> str:
        """``host:port`` actually bound (after start)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The console's base URL (after start)."""
        scheme = "https" if self._settings.allow_remote else "http"
        return f"{scheme}://{self.address}"

    def _tls(self) -> ssl.SSLContext:
        tls = self._source.config.tls
        if not isinstance(tls, TlsFiles):  # fail closed rather than serve without mTLS
            raise AgentConfigError(
                "[console] allow_remote needs [tls] files; with the Workload API keep the "
                "console on loopback"
            )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca))
        context.load_cert_chain(str(tls.cert), str(tls.key))
        context.verify_mode = ssl.CERT_REQUIRED
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def _app(self) -> Starlette:
        admission = (
            Middleware(OperatorsOnly, operators=self._settings.operators)
            if self._settings.allow_remote
            else Middleware(LoopbackHostGuard, refusal=_MISDIRECTED)
        )
        return Starlette(
            routes=[
                *(Route(path, self._page) for path in _PAGES),
                *(Route(path, self._health) for path in sorted(HEALTH_PATHS)),
                Route("/events", self._live_pages),
                Route("/static/{name}", _static),
            ],
            middleware=[
                Middleware(SecurityHeaders),
                Middleware(AnswerFailures),
                admission,
                Middleware(GetOnly, refusal="read-only: GET only\n"),
                Middleware(BoundedQuery),
            ],
            exception_handlers={404: _not_found},
        )

    async def start(self) -> int:
        """Bind, start the live feed and serve; returns the bound port.

        Raises:
            GatewayError: The address cannot be bound or the TLS files not loaded.
        """
        try:
            await self._listener.start(self._host, self._port)
        except ssl.SSLError as err:
            raise AgentConfigError(
                f"console: cannot load its TLS material for {self._settings.listen}: {err}"
            ) from err
        except OSError as err:
            raise AddressUnavailable(
                f"console: cannot listen on {self._settings.listen}: {err}"
            ) from err
        self._started = True
        await self._live.start()
        _log.info("console on %s", self.url)
        return self.port

    async def stop(self) -> None:
        """Stop serving; open event streams end (idempotent)."""
        if not self._started:
            return
        self._started = False
        await self._live.stop()
        for writer in list(self._live_pages.writers):
            writer.cancel()
        await self._listener.stop()

    async def _page(self, request: Request) -> Response:
        path = request.scope["path"]
        title, view = _PAGES[path]
        body = await _page_body(view, self._source, Query.of(request))
        page = layout(
            title, path, self._source.config.id, body, refresh=_REFRESH_SECONDS.get(path, 0)
        )
        return Response(page, media_type=HTML)

    async def _health(self, request: Request) -> Response:
        status, body = health_answer(request.scope["path"], self._source.health_state)
        return text(int(status.split(" ", 1)[0]), body)


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _STATIC:
        return text(404, "not found\n")
    data = (resources.files("gateway.console") / "static" / name).read_bytes()
    return Response(data, media_type=_STATIC[name])


async def _not_found(_request: Request, _exc: object) -> Response:
    return text(404, "not found\n")


async def _page_body(
    view: Callable[[views.ConsoleSource, Query], Awaitable[str] | str],
    source: views.ConsoleSource,
    query: Query,
) -> str:
    """The view's HTML, or the problem that kept it from reading (e.g. an altered audit log)."""
    try:
        produced = view(source, query)
        return produced if isinstance(produced, str) else await produced
    except ConfigError as err:  # the operator's store or files, named on the page, not a 500
        return problem_note(err.message)


def _resume_after(last_event_id: str | None) -> int | None:
    """The seq a reconnecting page last got (its ``Last-Event-ID``), if it is one."""
    if last_event_id is None or not last_event_id.isascii() or not last_event_id.isdigit():
        return None
    return int(last_event_id) if len(last_event_id) <= 18 else None  # a seq is an SQL bigint


class LivePages:
    """``/events``: server-sent events, one ``decision`` event per new record that passes
    the filters, to at most ``MAX_STREAMS`` pages at once.

    A stream ends when the live feed ends, the client stalls, or the client
    closes its side (watched for at once, so the slot is free for the next page).
    """

    def __init__(self, feed: LiveDecisions) -> None:
        self._feed = feed
        self.writers: set[asyncio.Task[None]] = set()
        """The event writers of the pages open now (cancelled: their streams end)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one live page until its stream ends."""
        if len(self.writers) >= MAX_STREAMS:
            await text(503, "too many live pages\n")(scope, receive, send)
            return
        request = Request(scope)
        wanted = views.Filters.of(Query.of(request))
        last = request.headers.getlist("last-event-id")
        resume = _resume_after(last[-1] if last else None)
        backlog = functools.partial(self._feed.after, resume) if resume is not None else None
        queue = self._feed.subscribe()
        stream = _Stream(send, connection_abort(scope))
        events = asyncio.ensure_future(_send_events(wanted, queue, stream, backlog))
        self.writers.add(events)
        closed = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait((events, closed), return_when=asyncio.FIRST_COMPLETED)
            if events.done() and not events.cancelled():
                events.result()  # re-raises a fault of ours (a client that went is none)
        finally:
            self._feed.unsubscribe(queue)
            self.writers.discard(events)
            for side in (events, closed):
                side.cancel()
            await asyncio.gather(events, closed, return_exceptions=True)
            await stream.end()


class _Stream:
    """The event stream's answer: each write waits at most ``http.DRAIN_TIMEOUT`` for the
    client to take what came before (a stalled client must not hold its connection for as
    long as TCP would: it is dropped)."""

    def __init__(self, send: Any, abort: Callable[[], None] | None) -> None:
        self._send = send
        self._abort = abort
        self._started = False
        self._ended = False

    async def _within(self, message: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(http.DRAIN_TIMEOUT):
                await self._send(message)
        except TimeoutError:
            if self._abort is not None:
                self._abort()
            raise

    async def write(self, data: bytes) -> None:
        """Send ``data`` (the answer's head first).

        Raises:
            TimeoutError: The client took nothing for ``DRAIN_TIMEOUT`` seconds (dropped).
        """
        if not self._started:
            self._started = True
            head = [(b"content-type", b"text/event-stream; charset=utf-8")]
            await self._within({"type": "http.response.start", "status": 200, "headers": head})
        await self._within({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self) -> None:
        """End the answer (idempotent; a client that went or stalls is no error)."""
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(TimeoutError, OSError):
            if not self._started:
                await self.write(b"")
            await self._within({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_events(
    wanted: views.Filters,
    queue: asyncio.Queue[AuditRecord | None],
    stream: _Stream,
    backlog: Callable[[], Awaitable[list[AuditRecord]]] | None = None,
) -> None:
    """Write the stream until the feed ends it (None) or the client stalls or goes.

    A reconnecting page (``backlog``: what committed after its last event) gets
    that first; then the feed, without what the backlog held already (``queue``
    was subscribed before the backlog was read, so nothing falls between). A
    backlog cut at its bound ends the stream: the page reconnects from there.
    """
    sent = 0
    with contextlib.suppress(TimeoutError, ConnectionError, OSError):
        await stream.write(b"retry: 2000\n: connected\n\n")
        if backlog is not None:
            try:
                missed = await backlog()
            except ConfigError as err:  # the store is away: no gap filled, named in the log
                _log.warning("console: cannot resume a live page: %s", err.message)
                missed = []
            for earlier in missed:
                sent = max(sent, earlier.seq)
                if wanted.matches(earlier):
                    await stream.write(_event(earlier))
            if len(missed) >= live.QUEUE_RECORDS:
                return
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_SECONDS):
                    rec = await queue.get()
            except TimeoutError:
                await stream.write(b": keepalive\n\n")
            else:
                if rec is None:
                    return
                if rec.seq > sent and wanted.matches(rec):
                    await stream.write(_event(rec))


def _event(rec: AuditRecord) -> bytes:
    return f"id: {rec.seq}\nevent: decision\ndata: {event_data(rec)}\n\n".encode()


async def _until_disconnect(receive: Any) -> None:
    """Return once the client goes (a request body it sends is ignored)."""
    while (await receive())["type"] != "http.disconnect":
        pass
