"""The console's own listener in the agent process: pages, live events, health, static files.

Loopback plain HTTP by default. With ``[console] allow_remote = true`` it
speaks TLS with the agent's certificate and admits only a client
certificate from the agent's CA whose SPIFFE ID is in ``operators``
(anything else: the handshake fails, or 403). Read-only: only GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources

from gateway.audit.record import AuditRecord
from gateway.config import ConsoleSettings, TlsFiles
from gateway.config.addresses import names_this_machine
from gateway.console import live, status_views, views
from gateway.console.http import (
    HTML,
    TEXT,
    BadRequest,
    Request,
    close_quietly,
    drain,
    read_request,
    respond,
    response_head,
)
from gateway.console.live import LiveDecisions, event_data
from gateway.console.pages import layout, problem_note
from gateway.errors import AgentConfigError, ConfigError, GatewayError, Unauthenticated
from gateway.telemetry.health_http import HEALTH_PATHS, health_answer
from policies.identity import spiffe_id_from_pem

_log = logging.getLogger(__name__)
KEEPALIVE_SECONDS = 15.0
MAX_STREAMS = 32
"""Live pages open at once; more are answered 503 (each holds a connection and a queue)."""
_STATIC = {
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}
_PAGES: dict[str, tuple[str, Callable[[views.ConsoleSource, Request], Awaitable[str] | str]]] = {
    "/": ("Live decisions", views.decisions),
    "/refusals": ("Refusals by peer and reason", views.refusals),
    "/grants": ("Grants", lambda source, _: status_views.grants(source)),
    "/certificate": ("Certificate", lambda source, _: status_views.certificate(source)),
    "/upstreams": ("Upstream agents", lambda source, _: status_views.upstreams(source)),
    "/audit": ("Audit chain and checkpoints", status_views.audit_status),
    "/tasks": ("Calls and A2A tasks in flight", lambda source, _: status_views.in_flight(source)),
}


class ConsoleServer:
    """Serves the console of one agent (``start`` after the audit log is open)."""

    def __init__(self, settings: ConsoleSettings, source: views.ConsoleSource) -> None:
        self._settings = settings
        self._source = source
        host, _, port = settings.listen.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._server: asyncio.Server | None = None
        self._live = LiveDecisions(source.config)
        self._streams: set[asyncio.Task[None]] = set()
        self.port = 0

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

    def _tls(self) -> ssl.SSLContext | None:
        if not self._settings.allow_remote:
            return None
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

    async def start(self) -> int:
        """Bind, start the live feed and serve; returns the bound port.

        Raises:
            GatewayError: The address cannot be bound or the TLS files not loaded.
        """
        try:
            context = self._tls()
            self._server = await asyncio.start_server(
                self._serve, self._host, self._port, ssl=context
            )
        except (OSError, ssl.SSLError) as err:
            raise GatewayError(f"console: cannot listen on {self._settings.listen}: {err}") from err
        await self._live.start()
        self.port = int(self._server.sockets[0].getsockname()[1])
        _log.info("console on %s", self.url)
        return self.port

    async def stop(self) -> None:
        """Stop serving; open event streams end (idempotent)."""
        if self._server is None:
            return
        self._server.close()
        await self._live.stop()
        for stream in list(self._streams):
            stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._streams, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not self._admitted(writer):
                await respond(writer, "403 Forbidden", TEXT, "not an operator of this agent\n")
                return
            request = await read_request(reader)
            if not self._settings.allow_remote and not _for_this_listener(request):
                await respond(writer, "421 Misdirected Request", TEXT, _MISDIRECTED)
                return
            await self._route(request, reader, writer)
        except BadRequest as err:
            await respond(writer, err.status, TEXT, "")
        except (ConnectionError, ssl.SSLError):
            writer.close()
        except Exception:  # one broken page must not take the console down
            _log.exception("console: answering failed")
            with contextlib.suppress(ConnectionError, OSError):
                await respond(writer, "500 Internal Server Error", TEXT, "internal error\n")

    def _admitted(self, writer: asyncio.StreamWriter) -> bool:
        if not self._settings.allow_remote:
            return True
        tls = writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        if not der:
            return False
        try:
            caller = spiffe_id_from_pem(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))
        except Unauthenticated:
            return False
        return caller in self._settings.operators

    async def _route(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if request.method != "GET":
            await respond(writer, "405 Method Not Allowed", TEXT, "read-only: GET only\n")
        elif request.path in HEALTH_PATHS:
            status, body = health_answer(request.path, self._source.health_state)
            await respond(writer, status, TEXT, body)
        elif request.path == "/events" and len(self._streams) >= MAX_STREAMS:
            await respond(writer, "503 Service Unavailable", TEXT, "too many live pages\n")
        elif request.path == "/events":
            await self._stream(request, reader, writer)
        elif request.path.startswith("/static/"):
            name = request.path.removeprefix("/static/")
            if name not in _STATIC:
                await respond(writer, "404 Not Found", TEXT, "not found\n")
                return
            data = (resources.files("gateway.console") / "static" / name).read_bytes()
            await respond(writer, "200 OK", _STATIC[name], data)
        elif request.path in _PAGES:
            title, view = _PAGES[request.path]
            body = await _page_body(view, self._source, request)
            page = layout(title, request.path, self._source.config.id, body)
            await respond(writer, "200 OK", HTML, page)
        else:
            await respond(writer, "404 Not Found", TEXT, "not found\n")

    async def _stream(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Server-sent events: one ``decision`` event per new record that passes the filters.

        Ends when the live feed ends, the client stalls, or the client closes
        its side (watched for at once, so the slot is free for the next page).
        """
        queue = self._live.subscribe()
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        resume = _resume_after(request.last_event_id)
        backlog = functools.partial(self._live.after, resume) if resume is not None else None
        events = asyncio.ensure_future(
            _send_events(views.Filters.of(request), queue, writer, backlog)
        )
        closed = asyncio.ensure_future(_until_closed(reader))
        try:
            await asyncio.wait((events, closed), return_when=asyncio.FIRST_COMPLETED)
            if events.done():
                events.result()  # re-raises a fault of ours (a client that went is none)
        finally:
            self._live.unsubscribe(queue)
            self._streams.discard(task)
            for side in (events, closed):
                side.cancel()
            await asyncio.gather(events, closed, return_exceptions=True)
            await close_quietly(writer)


_MISDIRECTED = "this console answers only requests for its own address\n"


def _for_this_listener(request: Request) -> bool:
    """Whether a loopback console's request names this machine (no Host: not a browser)."""
    return request.host is None or names_this_machine(request.host)


async def _page_body(
    view: Callable[[views.ConsoleSource, Request], Awaitable[str] | str],
    source: views.ConsoleSource,
    request: Request,
) -> str:
    """The view's HTML, or the problem that kept it from reading (e.g. an altered audit log)."""
    try:
        produced = view(source, request)
        return produced if isinstance(produced, str) else await produced
    except ConfigError as err:  # the operator's store or files, named on the page, not a 500
        return problem_note(err.message)


def _resume_after(last_event_id: str | None) -> int | None:
    """The seq a reconnecting page last got (its ``Last-Event-ID``), if it is one."""
    if last_event_id is None or not last_event_id.isascii() or not last_event_id.isdigit():
        return None
    return int(last_event_id) if len(last_event_id) <= 18 else None  # a seq is an SQL bigint


async def _send_events(
    wanted: views.Filters,
    queue: asyncio.Queue[AuditRecord | None],
    writer: asyncio.StreamWriter,
    backlog: Callable[[], Awaitable[list[AuditRecord]]] | None = None,
) -> None:
    """Write the stream until the feed ends it (None) or the client stalls or goes.

    A reconnecting page (``backlog``: what committed after its last event) gets
    that first; then the feed, without what the backlog held already (``queue``
    was subscribed before the backlog was read, so nothing falls between). A
    backlog cut at its bound ends the stream: the page reconnects from there.
    """
    writer.write(response_head("200 OK", "text/event-stream; charset=utf-8", None))
    writer.write(b"retry: 2000\n: connected\n\n")
    sent = 0
    with contextlib.suppress(TimeoutError, ConnectionError, OSError):
        await drain(writer)
        if backlog is not None:
            try:
                missed = await backlog()
            except ConfigError as err:  # the store is away: no gap filled, named in the log
                _log.warning("console: cannot resume a live page: %s", err.message)
                missed = []
            for earlier in missed:
                sent = max(sent, earlier.seq)
                if wanted.matches(earlier):
                    writer.write(_event(earlier))
                    await drain(writer)
            if len(missed) >= live.QUEUE_RECORDS:
                return
        while True:
            try:
                rec = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                writer.write(b": keepalive\n\n")
            else:
                if rec is None:
                    return
                if rec.seq > sent and wanted.matches(rec):
                    writer.write(_event(rec))
            await drain(writer)


def _event(rec: AuditRecord) -> bytes:
    return f"id: {rec.seq}\nevent: decision\ndata: {event_data(rec)}\n\n".encode()


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Return once the client closes its side (anything it sends is ignored)."""
    with contextlib.suppress(ConnectionError, OSError):
        while await reader.read(4096):
            pass
