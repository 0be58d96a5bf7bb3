"""The HTTPS edge: the a2a-sdk's JSON-RPC and REST routes behind the gateway's own door.

Routes (the wire format of each is the SDK's own, so it is the spec's)::

    GET  /.well-known/agent-card.json   the public card (its 1.0 or 0.3 form, with caching
                                        headers: ``card_route``); the only answer without a
                                        certificate
    POST /a2a/jsonrpc                   JSON-RPC binding (SSE for the streaming methods)
    *    /a2a/rest/...                  HTTP+JSON binding (/message:send, /tasks/{id}, ...)

Before the SDK sees a request, the edge (in this order, each refusal audited once):

1. runs the Describe prefix of the decision path on the certificate the TLS
   handshake verified (audit available, identity, known peer, live grant,
   limits), taking the request's limit slot: its one token of the peer's rate,
   and its places (see :func:`_in_flight`); the pipeline adopts that slot
   when the servicer admits the request, so no second token is taken, and
   the edge gives it back if the request never gets that far;
2. refuses a request that names an identity in its headers
   (``X-Forwarded-Client-Cert``, ``Authorization``, ...: ``UNAUTHENTICATED``),
   except, with ``[identity.tokens]``, ``Authorization: Bearer`` and
   ``A2AGW-User-Token``: step 1 verified those (``gateway.identity``; a caller
   without a certificate is identified by its token here, and only here, if
   ``token_only_callers``), and a 401 then says ``WWW-Authenticate: Bearer``;
3. refuses a request whose body, or whose write, is not declared JSON
   (``media_types.declared_json``: ``CONTENT_TYPE_NOT_SUPPORTED``, JSON-RPC ``-32005``,
   HTTP ``415``), so that a form or ``text/plain`` post, which a browser sends
   cross-site without asking (and with the client certificate it holds),
   never runs;
4. reads the body up to the caller's limit, twice the grant's payload cap
   plus :data:`ENVELOPE_BYTES` (JSON escapes and base64 make a payload larger
   on the wire than the bytes the cap counts); a longer body is refused
   ``PAYLOAD_TOO_LARGE`` without being decoded, from its ``Content-Length``
   when it has one; a body that takes longer than :data:`BODY_SECONDS` is
   refused ``DEADLINE_EXCEEDED``.

Then the SDK parses the request and calls ``ServicerRequestHandler``, i.e. the
same servicer method, decision path and audit record as on gRPC. A request
the SDK refuses itself (not JSON, not JSON-RPC, params that do not parse,
unknown method) never reaches the servicer: the edge audits it as
``INVALID_REQUEST`` and answers it with our reason added.

With ``[a2a] v0_3_compat`` the same routes also take A2A 0.3 requests (the
SDK's compat adapters: JSON-RPC ``message/send`` ... on the same path, REST
under ``/a2a/rest/v1/...``). They pass the same edge first (every route here
is guarded, and a JSON-RPC request is checked before its method is known);
the SDK translates them to 1.0 and calls the same handler. A 0.3 stream the
SDK does not start itself is run to its first event here, so a refusal is
answered and the limit slot adopted before the response goes out.

Every SSE stream's writes wait at most ``[a2a] stream_send_timeout`` seconds
for the client to read (:class:`_SendBounded`): a client that stops reading
has its connection dropped, with what was buffered for it, and the stream's
done callbacks run, so its subscription's place is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from enum import Enum
from typing import Any

import orjson
from a2a.server.context import ServerCallContext
from a2a.server.routes import (
    ServerCallContextBuilder,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import A2AError
from sse_starlette.sse import EventSourceResponse, SendTimeoutError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    TokenInvalid,
    Unauthenticated,
)
from gateway.http.connection import client_certificate, connection_abort
from gateway.identity import AUTHORIZATION, USER_TOKEN, PresentedTokens, presented_tokens
from gateway.inbound.in_flight import serving_binding
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.pipeline import InFlight
from gateway.server.a2a.card import PublicCardDocuments
from gateway.server.a2a.servicer import A2AServicer
from gateway.server.a2a_http.card_route import CardRoute
from gateway.server.a2a_http.context import (
    EXCHANGE_KEY,
    VERSION_METADATA,
    Exchange,
    claimed_version,
    is_v0_3_version,
    run_done_callbacks,
)
from gateway.server.a2a_http.fast_json import ParsedJsonRequest, use_fast_json
from gateway.server.a2a_http.file_bytes import check_file_bytes
from gateway.server.a2a_http.handler import ServicerRequestHandler, speaks_v0_3
from gateway.server.a2a_http.media_types import (
    REST_MEDIA_TYPE,
    V0_3_REST_MEDIA_TYPE,
    declared_json,
    relabelled,
)
from gateway.server.a2a_http.stream_errors import ErrorBody, with_our_stream_errors
from gateway.server.a2a_http.wire_errors import (
    http_status,
    jsonrpc_error,
    jsonrpc_v0_3_error,
    rest_error,
)

_log = logging.getLogger(__name__)

JSONRPC_PATH = "/a2a/jsonrpc"
REST_PATH = "/a2a/rest"
V0_3_REST_PREFIX = "/v1"
"""Where the SDK's 0.3 REST routes live under :data:`REST_PATH` (``/v1/message:send`` ...)."""
ENVELOPE_BYTES = 64 * 1024
"""What a request may hold besides its payload (ids, metadata, JSON-RPC framing)."""
BODY_SECONDS = 30.0
"""How long a request's body may take to arrive once its headers have: a body sent
slowly (or never finished) would otherwise hold its connection and buffer for good,
and a JSON-RPC request holds no place under ``max_in_flight`` while it is read."""
IDENTITY_HEADERS = frozenset(
    {
        "authorization",
        "x-forwarded-client-cert",
        "x-client-cert",
        "x-ssl-client-cert",
        "ssl-client-cert",
        "x-client-certificate",
        "x-spiffe-id",
        # What TLS-terminating proxies and auth proxies put in front of a backend
        # (nginx, Traefik, AWS ALB, Azure, Apache, oauth2-proxy), and proxy credentials.
        "proxy-authorization",
        "x-forwarded-tls-client-cert",
        "x-forwarded-tls-client-cert-info",
        "x-amzn-mtls-clientcert",
        "x-arr-clientcert",
        "x-ssl-client-dn",
        "x-ssl-client-s-dn",
        "x-ssl-client-verify",
        "x-client-dn",
        "x-client-verify",
        "remote-user",
        "x-remote-user",
        "x-forwarded-user",
        "x-forwarded-email",
        "x-auth-request-user",
        "x-auth-request-email",
    }
)
"""Headers that claim an identity: refused, since only the handshake names the caller."""
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_ENDPOINT = Callable[[Request], Awaitable[Response]]


class Binding(Enum):
    """The two HTTP bindings of A2A 1.0 (their errors differ in form)."""

    JSONRPC = "JSON-RPC"
    REST = "HTTP+JSON"


class _SdkVersionHeaders(dict[str, str]):
    """The ``A2A-Version`` the SDK's own check is shown: the one it expects.

    The SDK checks A2A-Version itself, before any identity and unaudited: its
    1.0 routes want 1.0, its 0.3 adapters 0.3. It is told what the route that
    parsed the request wants (the 0.3 adapters set the method before they
    check), so the servicer's check (metadata a2a-version, after identity,
    audited, the same as on gRPC) is the one that decides.
    """

    def __init__(self, state: MutableMapping[str, Any]) -> None:
        super().__init__()
        self._state = state

    def get(self, key: str, default: Any = None) -> Any:
        """``a2a-version`` (any case): "0.3" for a 0.3 request, else "1.0"."""
        if key.lower() != "a2a-version":
            return default
        return "0.3" if speaks_v0_3(self._state) else "1.0"


class _ContextBuilder(ServerCallContextBuilder):
    """Hands the edge's :class:`Exchange` to the request handler through the call context."""

    def build(self, request: Request) -> ServerCallContext:
        context = ServerCallContext(state={EXCHANGE_KEY: request.scope[EXCHANGE_KEY]})
        # Set on the context's own state (the model copies what it is given),
        # where the SDK puts the method before it checks the version.
        context.state["headers"] = _SdkVersionHeaders(context.state)
        return context


class HttpEdge:
    """Builds the ASGI app of the HTTP bindings for one agent."""

    def __init__(
        self,
        handler: InvokeHandler,
        servicer: A2AServicer,
        public_card: Callable[[], PublicCardDocuments],
        *,
        v0_3_compat: bool = False,
        stream_send_timeout: float = 30.0,
    ) -> None:
        self._handler = handler
        self._v0_3_compat = v0_3_compat
        self._stream_send_timeout = stream_send_timeout
        self._public_card = public_card
        self._sdk_handler = ServicerRequestHandler(servicer)
        self._card_route = CardRoute(v0_3_compat)
        self._accepts_tokens = handler.pipeline.tokens is not None
        # With tokens on, their two headers are the pipeline's to judge; every
        # other identity header is refused as before.
        self._refused_headers = (
            IDENTITY_HEADERS - {AUTHORIZATION, USER_TOKEN}
            if self._accepts_tokens
            else IDENTITY_HEADERS | {USER_TOKEN}
        )

    def _tokens(self, request: Request) -> PresentedTokens | None:
        """The request's bearer tokens, if this agent takes any (else the header check
        refuses them)."""
        if not self._accepts_tokens:
            return None
        return presented_tokens(request.headers.items(), token_only_door=True)

    def app(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """The ASGI app: public card, JSON-RPC, REST, and a refusal for any other target."""
        routed = self._routed()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and not scope["path"].startswith("/"):
                # "*", "host:port" (CONNECT) or an absolute URL: uvicorn passes such a
                # target on as the path, which no route (not even "/{path:path}")
                # matches, and the router would answer 404 itself: unaudited.
                response = await self._unknown_path(Request(scope, receive))
                await response(scope, receive, send)
                return
            await routed(scope, receive, send)

        return app

    def _routed(self) -> Starlette:
        use_fast_json()
        builder = _ContextBuilder()
        compat = self._v0_3_compat
        jsonrpc = create_jsonrpc_routes(
            self._sdk_handler, JSONRPC_PATH, context_builder=builder, enable_v0_3_compat=compat
        )
        rest = create_rest_routes(
            self._sdk_handler,
            context_builder=builder,
            path_prefix=REST_PATH,
            enable_v0_3_compat=compat,
        )
        routes: list[BaseRoute] = [
            Route(AGENT_CARD_WELL_KNOWN_PATH, self._card, methods=["GET"]),
            *(self._guard(route, Binding.JSONRPC) for route in jsonrpc),
            *(self._guard(route, Binding.REST) for route in rest),
            _every_method(self._unknown_path),
        ]
        return Starlette(routes=routes)

    async def _card(self, request: Request) -> Response:
        version = claimed_version(_metadata(request))
        if_none_match = request.headers.get("if-none-match")
        return self._card_route.respond(self._public_card(), version, if_none_match)

    def _guard(self, route: BaseRoute, binding: Binding) -> BaseRoute:
        if isinstance(route, Mount):
            # The SDK's tenant mount (``/{tenant}/...``) takes every path of two or
            # more segments: one it does not serve is refused and audited here too.
            inner = [self._guard(r, binding) for r in route.routes]
            return Mount(route.path, routes=[*inner, _every_method(self._unknown_path)])
        assert isinstance(route, Route)
        operation = _operation(route.path) if binding is Binding.REST else binding.value
        v0_3 = route.path.startswith(REST_PATH + V0_3_REST_PREFIX + "/")
        return Route(
            route.path,
            self._guarded(route.endpoint, binding, operation, _in_flight(operation), v0_3=v0_3),
            methods=list(route.methods or ()),
        )

    def _guarded(
        self, endpoint: Any, binding: Binding, operation: str, kind: InFlight, *, v0_3: bool
    ) -> _ENDPOINT:
        async def guarded(request: Request) -> Response:
            serving_binding(f"A2A {binding.value}")
            exchange = Exchange(
                client_certificate(request.scope),
                _metadata(request),
                f"A2A {operation}",
                v0_3=v0_3,
                tokens=self._tokens(request),
            )
            try:
                body = await self._admit(request, exchange, kind)
            except GatewayError as err:
                return self._render(binding, err, request, exchange)
            scope = {**request.scope, EXCHANGE_KEY: exchange}
            try:
                response: Response = await endpoint(
                    ParsedJsonRequest(scope, receive=_refeed(body, request.receive))
                )
                if isinstance(response, EventSourceResponse) and not exchange.reached:
                    response = await _started(response, exchange)
            except BaseException:
                run_done_callbacks(exchange)
                raise
            finally:
                # Adopted by the pipeline, the slot is the call's (released when
                # it ends: at once, with its stream, or with its background task).
                assert exchange.slot is not None
                exchange.slot.release_unless_adopted()
            if exchange.refusal is not None:
                run_done_callbacks(exchange)
                return self._render(
                    binding, exchange.refusal, request, exchange, exchange.request_id
                )
            if not exchange.reached:  # the SDK refused it before our handler ran
                return await self._sdk_refusal(exchange, binding, response, request)
            error_body = _error_body(binding, exchange, v0_3=self._v0_3_compat and exchange.v0_3)
            response = _then(with_our_stream_errors(response, exchange, error_body), exchange)
            if isinstance(response, EventSourceResponse):
                return _SendBounded(response, exchange, self._stream_send_timeout)
            return relabelled(response)

        return guarded

    def _render(
        self,
        binding: Binding,
        error: GatewayError,
        request: Request,
        exchange: Exchange,
        request_id: str | int | None = None,
        *,
        sdk_code: int | None = None,
    ) -> Response:
        """``error`` in the binding's form, and in the 0.3 form for a 0.3 JSON-RPC client.

        Before the SDK has parsed a JSON-RPC request its method is not known;
        its client then speaks 0.3 if it sends no ``A2A-Version`` (the spec's
        0.3) or 0.3, as 0.3 clients do. A 0.3 client that asked for an event
        stream gets the error as one event, as its streams end. A 0.3 REST
        path (known from the route) is answered ``application/json``, 0.3's
        media type; a 1.0 one too (see ``media_types``).
        """
        response = self._rendered(binding, error, request, exchange, request_id, sdk_code)
        if self._accepts_tokens and isinstance(error, Unauthenticated):
            # RFC 6750 3: how to authenticate here; invalid_token for a token refused.
            challenge = 'Bearer realm="a2agw"'
            if isinstance(error, TokenInvalid):
                challenge += ', error="invalid_token"'
            response.headers["www-authenticate"] = challenge
        return response

    def _rendered(
        self,
        binding: Binding,
        error: GatewayError,
        request: Request,
        exchange: Exchange,
        request_id: str | int | None,
        sdk_code: int | None,
    ) -> Response:
        if binding is Binding.REST:
            media_type = V0_3_REST_MEDIA_TYPE if exchange.v0_3 else REST_MEDIA_TYPE
            return _render(binding, error, request_id, sdk_code=sdk_code, media_type=media_type)
        if exchange.reached:  # the SDK parsed it: its method says which version
            v0_3 = exchange.v0_3
        else:
            v0_3 = is_v0_3_version(claimed_version(exchange.metadata))
        if not (self._v0_3_compat and v0_3):
            return _render(binding, error, request_id, sdk_code=sdk_code)
        body = jsonrpc_v0_3_error(error, request_id, sdk_code)
        if "text/event-stream" in request.headers.get("accept", ""):
            return EventSourceResponse(_one_event(json.dumps(body)))
        return JSONResponse(body)

    async def _admit(self, request: Request, exchange: Exchange, kind: InFlight) -> bytes:
        """Identity, limits, no identity headers, the body within the caller's limit.

        Refusals are audited. On success ``exchange.slot`` holds the request's
        limit slot, taken before a byte of the body was read.
        """
        peer_id, grant, slot = await self._handler.admit_edge(
            exchange.peer_cert_pem, exchange.operation, kind, tokens=exchange.tokens
        )
        exchange.peer_id = peer_id
        try:
            self._no_identity_headers(request)
            declared_json(request, exchange.operation)
            async with asyncio.timeout(BODY_SECONDS):
                body = await _body_within(request, 2 * grant.max_payload_bytes + ENVELOPE_BYTES)
            _no_lone_surrogates(body)
            check_file_bytes(body)
        except TimeoutError as err:
            slot.slot.release()
            late = DeadlineExceeded(f"the request body did not arrive within {BODY_SECONDS:g} s")
            raise await self._handler.refuse(peer_id, late, exchange.operation) from err
        except GatewayError as err:
            slot.slot.release()
            raise await self._handler.refuse(peer_id, err, exchange.operation) from err
        except ClientDisconnect as err:
            # uvicorn ends the body this way when the connection closes or its
            # chunked encoding is invalid (it has answered 400 itself then): a
            # refusal like any other, not a traceback in the log.
            slot.slot.release()
            cut = InvalidRequest(CUT_OFF_BODY)
            raise await self._handler.refuse(peer_id, cut, exchange.operation) from err
        except BaseException:  # cancelled while the body was being read
            slot.slot.release()
            raise
        exchange.slot = slot
        return body

    def _no_identity_headers(self, request: Request) -> None:
        claimed = sorted(self._refused_headers.intersection(request.headers.keys()))
        if claimed:
            raise Unauthenticated(
                f"the caller is identified by its TLS client certificate only; "
                f"remove the header {claimed[0]}"
            )

    async def _sdk_refusal(
        self, exchange: Exchange, binding: Binding, response: Response, request: Request
    ) -> Response:
        code, message, request_id = _sdk_error(response, binding)
        if code in (_JSONRPC_INTERNAL, 500):
            # The SDK failed on input it never handed on (a JSON nesting deeper than
            # Python's recursion limit): the request is invalid, and the failure's
            # text is not the client's business.
            code = _JSONRPC_INVALID if binding is Binding.JSONRPC else 400
            message = ""
        if message not in _SDK_FIXED_TEXTS:
            # The SDK's parse errors quote the request ("Struct must be in a dict
            # which is <the caller's value>"): never sent back or logged as ours.
            message = ""
        error = InvalidRequest(message or "the request is not a valid A2A request")
        await self._handler.refuse(exchange.peer_id, error, exchange.operation)
        return self._render(binding, error, request, exchange, request_id, sdk_code=code)

    async def _unknown_path(self, request: Request) -> Response:
        exchange = Exchange(
            client_certificate(request.scope),
            _metadata(request),
            "A2A HTTP",
            tokens=self._tokens(request),
        )
        # A method outside _METHODS gets an HTTP status, never JSON-RPC's 200:
        # a 2xx answer to CONNECT would turn the connection into a tunnel.
        json_rpc = request.scope["path"] == JSONRPC_PATH and request.method in _METHODS
        binding = Binding.JSONRPC if json_rpc else Binding.REST
        try:
            peer_id, _ = await self._handler.admit_peer(
                exchange.peer_cert_pem, exchange.operation, tokens=exchange.tokens
            )
            target = request.scope["path"][:64]
            error = InvalidRequest(f"no A2A method at {request.method} {target}")
            raise await self._handler.refuse(peer_id, error, exchange.operation)
        except GatewayError as err:
            not_found = isinstance(err, InvalidRequest) and binding is Binding.REST
            return self._render(
                binding, err, request, exchange, sdk_code=404 if not_found else None
            )


async def _started(response: EventSourceResponse, exchange: Exchange) -> Response:
    """``response`` with its stream run to the first event (the SDK's 0.3 adapters start
    it only once the response is sent): the servicer has then admitted or refused it."""
    events = aiter(response.body_iterator)
    try:
        first = await anext(events)
    except StopAsyncIteration:
        return response
    except A2AError:  # the 0.3 REST adapter lets a refusal out of its stream
        if exchange.refusal is None:
            raise
        return response
    except Exception:
        if exchange.reached:
            raise
        # The 0.3 REST adapter parses the body inside its stream: a body it cannot
        # parse is the SDK's refusal (audited, 400), not a 500 with a traceback
        # that quotes the body in the log.
        return JSONResponse({"error": {"code": -32602, "message": _UNPARSED}}, status_code=400)
    if exchange.refusal is not None:  # the 0.3 JSON-RPC adapter made it an event: ours is sent
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
        return response
    response.body_iterator = _chained(first, events)
    return response


class _SendBounded(Response):
    """``stream``, each of whose writes waits at most ``timeout`` seconds for its client.

    A write waits while the connection's send buffer is full, i.e. while the
    client does not read: without a bound, a client that stops reading holds
    its connection and everything buffered for it for as long as it likes,
    after its task has ended and given back its place. Every write is bounded,
    the stream's last one too (sse_starlette's own ``send_timeout`` skips
    it). A write that times out raises ``SendTimeoutError`` out of the stream
    (whose background task, which runs the done callbacks, then does not
    run): the connection is aborted, which frees its buffer at once (a close
    would wait for the client to read it), and the done callbacks run.
    """

    def __init__(self, stream: EventSourceResponse, exchange: Exchange, timeout: float) -> None:
        # No Response.__init__: this response only forwards to ``stream``,
        # which holds the status, headers and background task.
        self.stream = stream
        self.exchange = exchange
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send ``stream``; on a write that timed out, drop the connection and end the call."""

        async def bounded(message: Message) -> None:
            try:
                async with asyncio.timeout(self.timeout):
                    await send(message)
            except TimeoutError as err:
                raise SendTimeoutError from err

        try:
            await self.stream(scope, receive, bounded)
            return
        except SendTimeoutError:
            pass
        exchange = self.exchange
        # Ids only: what the stream held is the caller's business.
        _log.warning(
            "ended the %s stream of %s: its client read nothing for %g s",
            exchange.operation,
            exchange.peer_id,
            self.timeout,
        )
        abort = connection_abort(scope)
        if abort is not None:
            abort()
            # uvicorn hears of the abort on a later turn of the loop; once it has,
            # a response left unfinished is not logged as the app's error.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    while (await receive())["type"] != "http.disconnect":
                        pass
        if self.stream.background is not None:
            await self.stream.background()


_UNPARSED = "the request body is not a valid A2A 0.3 request"
CUT_OFF_BODY = "the request body was cut off (connection closed, or invalid chunked encoding)"
_SDK_FIXED_TEXTS = frozenset(
    {
        *(kind.message for kind in A2AError.__subclasses__() if isinstance(kind.message, str)),
        A2AError.message,
        "Batch requests are not supported",
        "Invalid request: 'jsonrpc' must be exactly '2.0'",
        "Invalid request: id must be a string, integer, or null",
        "Method is required",
        "Payload too large",
        "Parse error",
    }
)
"""The SDK's error messages that are fixed texts: the only ones passed on to the caller."""
_JSONRPC_INTERNAL = -32603
_JSONRPC_INVALID = -32600


def _every_method(endpoint: _ENDPOINT) -> Route:
    """The route of every other path, for every method (OPTIONS, TRACE, PROPFIND ...).

    Without it the router answers a method no route lists ``405`` itself:
    before identity, to a caller without a certificate, and unaudited.
    """
    route = Route("/{path:path}", endpoint, methods=_METHODS)
    route.methods = None  # matches whatever the method
    return route


async def _chained(first: Any, rest: Any) -> Any:
    yield first
    async for event in rest:
        yield event


async def _one_event(data: str) -> Any:
    yield {"data": data}


def _operation(path: str) -> str:
    """The A2A method a REST route serves (1.0 or 0.3 path), for the audit record."""
    path = path.removeprefix(REST_PATH)
    if path.startswith(V0_3_REST_PREFIX + "/"):
        path = path.removeprefix(V0_3_REST_PREFIX)
        if path == "/card":
            return "GetExtendedAgentCard"
    known = {
        "/message:send": "SendMessage",
        "/message:stream": "SendStreamingMessage",
        "/tasks/{id}:cancel": "CancelTask",
        "/tasks/{id}:subscribe": "SubscribeToTask",
        "/tasks/{id}": "GetTask",
        "/tasks": "ListTasks",
        "/extendedAgentCard": "GetExtendedAgentCard",
    }
    return known.get(path, "push notification config")


def _in_flight(operation: str) -> InFlight:
    """How the edge takes a request's slot, before it knows more than the route.

    A REST route names its method, so its kind is exact. A JSON-RPC request
    names it in the body: the edge takes a poll's slot (the rate's token, no
    room under ``max_in_flight``), and the pipeline checks the room once the
    method is known (``DecisionPipeline.within_limits``).
    """
    if operation in {"GetTask", "ListTasks", "CancelTask", Binding.JSONRPC.value}:
        return InFlight.POLL
    return InFlight.HOLD if operation == "SubscribeToTask" else InFlight.ROOM


def _then(response: Response, exchange: Exchange) -> Response:
    """``response``, running the servicer's done callbacks once it is sent (an SSE
    response is still streaming when the endpoint returns it)."""
    earlier = response.background

    async def done() -> None:
        run_done_callbacks(exchange)
        if earlier is not None:
            await earlier()

    response.background = BackgroundTask(done)
    return response


def _metadata(request: Request) -> tuple[tuple[str, str], ...]:
    """The headers as gRPC metadata pairs, and the ``A2A-Version`` request parameter if no header
    names the version: A2A 1.0 lets a client send it either way (section 3.6.1; the header wins)."""
    metadata = tuple((name, value) for name, value in request.headers.items())
    if claimed_version(metadata) is None:
        for name, value in request.query_params.multi_items():
            if name.lower() == VERSION_METADATA:
                return (*metadata, (VERSION_METADATA, value))
    return metadata


async def _body_within(request: Request, limit: int) -> bytes:
    """The request body, refused PAYLOAD_TOO_LARGE past ``limit`` bytes (never decoded)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"the request body is {int(declared)} bytes; this peer's limit is {limit}"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body exceeds this peer's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _no_lone_surrogates(body: bytes) -> None:
    """Refuse a JSON body holding a string with a lone surrogate (INVALID_REQUEST).

    ``json`` reads one (``"\\ud800"``) as a str that has no UTF-8 form: every
    answer that echoes it (a JSON-RPC id, the SDK's parse error quoting a
    value) then fails to encode, a 500 that is not audited and whose traceback
    quotes the request in the log. Such text is not Unicode (RFC 8259 8.1-8.2).

    Cheap on every body: one needs an escape (a backslash) or surrogate bytes
    (0xED), and two ``memchr`` scans rule both out (~10 µs at 256 KB, where a
    regex took ~2 ms); orjson refuses every lone surrogate, so only a body it
    cannot read is decoded the slow way.
    """
    if b"\\" not in body and b"\xed" not in body:
        return
    try:
        orjson.loads(body)
        return
    except orjson.JSONDecodeError:
        pass
    try:
        json.dumps(json.loads(body), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidRequest("the request body holds a lone UTF-16 surrogate") from err
    except (ValueError, RecursionError):
        return  # not JSON the SDK reads: its own parse error answers it


def _refeed(
    body: bytes, then: Callable[[], Awaitable[Any]]
) -> Callable[[], Awaitable[dict[str, Any]]]:
    """``receive`` for the SDK: the body already read, then the connection's own events
    (an SSE response learns that its client went away from them)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            message: dict[str, Any] = await then()
            return message
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _sdk_error(response: Response, binding: Binding) -> tuple[int, str, str | int | None]:
    """(code, message, request id) of an error the SDK answered (JSON-RPC code or HTTP status)."""
    try:
        body = json.loads(bytes(response.body))
        error = body.get("error") or {}
    except (ValueError, AttributeError):
        return response.status_code, "", None
    message = str(error.get("message", ""))[:200]
    if binding is Binding.JSONRPC:
        request_id = body.get("id")
        code = error.get("code")
        return (
            code if isinstance(code, int) else -32600,
            message,
            request_id if isinstance(request_id, str | int) else None,
        )
    return response.status_code, message, None


def _error_body(binding: Binding, exchange: Exchange, *, v0_3: bool) -> ErrorBody:
    """How ``binding`` puts an error in a body (a stream's error event, once it started).

    A 0.3 JSON-RPC client gets the 0.3 error form, as before its stream started.
    """
    if binding is Binding.JSONRPC and v0_3:
        return lambda error: jsonrpc_v0_3_error(error, exchange.request_id)
    if binding is Binding.JSONRPC:
        return lambda error: jsonrpc_error(error, exchange.request_id)
    return rest_error


def _render(
    binding: Binding,
    error: GatewayError,
    request_id: str | int | None = None,
    *,
    sdk_code: int | None = None,
    media_type: str = REST_MEDIA_TYPE,
) -> Response:
    if binding is Binding.JSONRPC:
        body = jsonrpc_error(error, request_id)
        if sdk_code is not None:
            body["error"]["code"] = sdk_code
        return JSONResponse(body)
    status = sdk_code if sdk_code is not None else http_status(error)
    content = rest_error(error)
    content["error"]["code"] = status
    return JSONResponse(content, status_code=status, media_type=media_type)
