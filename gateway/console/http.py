"""The console's HTTP conventions: the middleware in front of its pages, the query they read.

Every answer carries the same security headers (:class:`SecurityHeaders`): a
Content-Security-Policy that allows only this origin (no inline script or
style, no frames, no other origin to connect to), ``nosniff``, no referrer,
and no caching. A remote console answers only its operators
(:class:`OperatorsOnly`, from the client certificate of the connection); a
query of more than :data:`MAX_FIELDS` parameters is a bad request
(:class:`BoundedQuery`); a page that fails is logged and answered 500
(:class:`AnswerFailures`). One request per connection
(``gateway.http.connection``); a server-sent event stream keeps its
connection until the client or the server ends it, and a client that stops
taking it is dropped after :data:`DRAIN_TIMEOUT`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import Unauthenticated
from gateway.http.connection import client_certificate
from policies.identity import spiffe_id_from_pem

_log = logging.getLogger(__name__)

MAX_FIELDS = 20
"""Query parameters a request may carry (a page reads five)."""
DRAIN_TIMEOUT = 10.0
"""Seconds a client may take to accept what was written before it is dropped."""

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
_ENCODED = [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS]


def text(status: int, body: str) -> Response:
    """A plain-text answer."""
    return Response(body, status, media_type=TEXT)


class TooManyFields(Exception):
    """The query string carries more than :data:`MAX_FIELDS` parameters (answered 400)."""


@dataclass(frozen=True, slots=True)
class Query:
    """A page's query parameters (the last value of each name; blank ones left out)."""

    values: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, request: Request) -> Query:
        """The query of ``request``.

        Raises:
            TooManyFields: More than :data:`MAX_FIELDS` parameters.
        """
        text = request.scope["query_string"].decode("latin-1")
        try:
            pairs = parse_qsl(text, keep_blank_values=False, max_num_fields=MAX_FIELDS)
        except ValueError:  # more than MAX_FIELDS parameters
            raise TooManyFields from None
        return cls(dict(pairs))

    def param(self, name: str) -> str:
        """The query parameter ``name``, stripped (``""`` when absent)."""
        return self.values.get(name, "").strip()


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every answer of the app it wraps."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass the request on; its answer's head gets the headers."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *_ENCODED]
            await send(message)

        await self._app(scope, receive, with_headers)


class OperatorsOnly:
    """Answers 403 unless the connection's client certificate names one of ``operators``."""

    def __init__(self, app: Any, operators: tuple[str, ...]) -> None:
        self._app = app
        self._operators = frozenset(operators)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass an operator's request on; answer anyone else's 403."""
        if scope["type"] == "http" and not self._admitted(client_certificate(scope)):
            await text(403, "not an operator of this agent\n")(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _admitted(self, pem: bytes | None) -> bool:
        if pem is None:
            return False
        try:
            return spiffe_id_from_pem(pem) in self._operators
        except Unauthenticated:
            return False


class BoundedQuery:
    """Answers 400 to a query string of more than :data:`MAX_FIELDS` parameters."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass the request on, or answer 400 here."""
        if scope["type"] == "http":
            try:
                Query.of(Request(scope))
            except TooManyFields:
                await text(400, "")(scope, receive, send)
                return
        await self._app(scope, receive, send)


class AnswerFailures:
    """One broken page must not take the console down: its failure is logged, answered 500."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass the request on; a failure becomes a 500 (or ends a stream already begun)."""
        sent: set[str] = set()  # "start", then "end" once the answer is whole

        async def watched(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent.add("start")
            elif not message.get("more_body", False):
                sent.add("end")
            await send(message)

        try:
            await self._app(scope, receive, watched)
        except Exception:
            _log.exception("console: answering failed")
            if "start" not in sent:
                await text(500, "internal error\n")(scope, receive, send)
            elif "end" not in sent:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
