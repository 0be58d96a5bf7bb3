"""The MCP edge: Streamable HTTP at ``/mcp``, behind the gateway's own door.

Every request, before anything of its body is read (each refusal audited once,
answered with a JSON-RPC error whose ``id`` is null and an HTTP status):

1. the Describe prefix of the decision path on the certificate the TLS
   handshake verified (audit available, identity, known peer, live grant,
   limits), taking the request's limit slot: one token of the peer's rate and
   a poll's place, made a call's place by the pipeline once a ``tools/call``
   is admitted (which adopts the slot: no second token);
2. the path is ``/mcp``; no header claims an identity (``Authorization``,
   ``X-Forwarded-Client-Cert``, ...: ``UNAUTHENTICATED``), except, with
   ``[identity.tokens]``, ``Authorization: Bearer`` and ``A2AGW-User-Token``:
   step 1 verified those, as on the A2A HTTPS edge (a caller without a
   certificate is identified by its token, if ``token_only_callers``); no ``Origin``
   (a browser's page: refused); on a loopback listener, a ``Host`` naming
   this machine (DNS rebinding); the method is ``POST`` (``GET`` and
   ``DELETE`` are answered ``405``: a stateless server has no stream or
   session to open or end);
3. the body, read up to twice the grant's payload cap plus
   :data:`ENVELOPE_BYTES` (refused ``PAYLOAD_TOO_LARGE`` past it, from
   ``Content-Length`` when sent), within :data:`BODY_SECONDS`.

Then the JSON-RPC message decides who answers. ``tools/list``,
``tools/call`` and ``notifications/cancelled`` are answered here, after the
SDK's own checks of the request (:mod:`~gateway.server.mcp.sdk_checks`): a
request they refuse is audited ``INVALID_REQUEST`` and answered as the SDK
answers it. Everything else goes to the SDK's server
(:mod:`~gateway.server.mcp.sdk_server`).

A ``tools/call`` is cancelled when its client closes the request (the
connection, or the event stream) or sends ``notifications/cancelled`` for it
(:mod:`~gateway.server.mcp.running_calls`); the call is audited ``CANCELLED``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from mcp.server.streamable_http import check_accept_headers
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope, Send

from capabilities.registry import CapabilityRegistry
from gateway.config.addresses import names_this_machine
from gateway.errors import (
    Cancelled,
    DeadlineExceeded,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    TokenInvalid,
    Unauthenticated,
)
from gateway.http.connection import client_certificate
from gateway.identity import AUTHORIZATION, USER_TOKEN, PresentedTokens, presented_tokens
from gateway.inbound.in_flight import serving_binding
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.pipeline import EdgeSlot, InFlight
from gateway.server.a2a_http.edge import IDENTITY_HEADERS
from gateway.server.a2a_http.wire_errors import http_status
from gateway.server.mcp.request_body import body_within
from gateway.server.mcp.responses import (
    EventStream,
    StreamDropped,
    error_body,
    response_body,
    send_empty,
    send_json,
)
from gateway.server.mcp.running_calls import (
    CANCELLED_BY_CLIENT,
    CLIENT_WENT_AWAY,
    RunningCalls,
    call_key,
)
from gateway.server.mcp.sdk_checks import ProtocolRefusal, checked_era, error_status
from gateway.server.mcp.sdk_server import SdkMcpServer
from gateway.server.mcp.tool_calls import (
    JsonRpcRefusal,
    ProgressEvents,
    answer_call,
    invoke_call,
)
from gateway.server.mcp.tool_listing import tools_of
from gateway.server.mcp.tool_results import (
    GATEWAY_REFUSAL,
    INVALID_PARAMS,
    error_object,
    jsonrpc_code,
)
from policies.decisions import visible_capabilities
from policies.grants import PeerGrant

MCP_PATH = "/mcp"
ENVELOPE_BYTES = 64 * 1024
"""What a request may hold besides the tool's arguments (JSON-RPC framing, ``_meta``)."""
BODY_SECONDS = 30.0
"""How long a request's body may take to arrive once its head has."""
OPERATION = "MCP"
"""The audit detail of a request refused before its method is known."""
PARSE_ERROR = -32700
INVALID_REQUEST_CODE = -32600
_ANSWERED_HERE = frozenset({"tools/list", "tools/call"})
_CANCELLED = "notifications/cancelled"
_MODERN_RESULT = {"resultType": "complete"}
_MODERN_LIST = {**_MODERN_RESULT, "ttlMs": 0, "cacheScope": "private"}
"""A tools list is this caller's (private), and stale at once: a policy reload may change it."""


class McpEdge:
    """The ASGI app of ``/mcp`` for one agent (see the module)."""

    def __init__(
        self,
        handler: InvokeHandler,
        registry: CapabilityRegistry,
        sdk: SdkMcpServer,
        *,
        send_timeout: float = 30.0,
        loopback: bool = True,
    ) -> None:
        """``loopback``: the listener is on a loopback address (``Host`` is checked)."""
        self._handler = handler
        self._registry = registry
        self._sdk = sdk
        self._send_timeout = send_timeout
        self._loopback = loopback
        self._tools: dict[str, dict[str, Any]] = {}
        self._accepts_tokens = handler.pipeline.tokens is not None
        # With tokens on, their two headers are the pipeline's to judge (as on the
        # A2A HTTPS edge); every other identity header is refused.
        self._refused_headers = (
            IDENTITY_HEADERS - {AUTHORIZATION, USER_TOKEN}
            if self._accepts_tokens
            else IDENTITY_HEADERS | {USER_TOKEN}
        )
        self.running = RunningCalls()
        """The ``tools/call`` requests being served (``notifications/cancelled`` finds them)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request."""
        if scope["type"] != "http":
            return
        serving_binding("MCP")  # for the calls in flight (the console)
        request = Request(scope, receive)
        cert = client_certificate(scope)
        tokens = None
        if self._accepts_tokens:
            tokens = presented_tokens(request.headers.items(), token_only_door=True)
        try:
            peer_id, grant, slot = await self._handler.admit_edge(
                cert, OPERATION, InFlight.POLL, tokens=tokens
            )
        except GatewayError as err:
            await self._refused(send, err)
            return
        try:
            caller = _Caller(peer_id, grant, slot, cert, tokens)
            await self._serve(request, scope, receive, send, caller)
        finally:
            slot.release_unless_adopted()

    async def _refused(self, send: Send, error: GatewayError, status: int | None = None) -> None:
        """A refusal before the JSON-RPC message was read: ``id`` null, an HTTP status
        (``status``, else the status table's; 413 for a body over the limit). With tokens
        on, a 401 says how to authenticate (RFC 6750)."""
        code = jsonrpc_code(error)
        coded = INVALID_REQUEST_CODE if isinstance(error, InvalidRequest) else GATEWAY_REFUSAL
        if status is None:
            status = 413 if isinstance(error, PayloadTooLarge) else http_status(error)
        headers: list[tuple[bytes, bytes]] = []
        if self._accepts_tokens and isinstance(error, Unauthenticated):
            invalid = ', error="invalid_token"' if isinstance(error, TokenInvalid) else ""
            headers.append((b"www-authenticate", f'Bearer realm="a2agw"{invalid}'.encode()))
        body = error_body(None, _coded(error, code or coded))
        await send_json(send, body, status, headers)

    async def _serve(
        self, request: Request, scope: Scope, receive: Receive, send: Send, caller: _Caller
    ) -> None:
        refused = self._refused_request(request)
        if refused is not None:
            error, status = refused
            await self._handler.refuse(caller.peer_id, error, OPERATION)
            await self._refused(send, error, status)
            return
        if request.method != "POST":
            await send_empty(send, 405, [(b"allow", b"POST")])
            return
        try:
            body = await _body(request, 2 * caller.grant.max_payload_bytes + ENVELOPE_BYTES)
        except GatewayError as err:
            await self._handler.refuse(caller.peer_id, err, OPERATION)
            await self._refused(send, err)
            return
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            error = InvalidRequest("the request body is not JSON")
            await self._handler.refuse(caller.peer_id, error, OPERATION)
            await send_json(send, error_body(None, _coded(error, PARSE_ERROR)), 400)
            return
        method = message.get("method") if isinstance(message, dict) else None
        if method in _ANSWERED_HERE and "id" in message:
            await self._answer(request, send, caller, message)
        elif method == _CANCELLED and "id" not in message:
            self._cancel(caller.peer_id, message)
            await send_empty(send, 202)
        else:
            await self._sdk.handle(scope, _refeed(body, receive), send)

    def _refused_request(self, request: Request) -> tuple[GatewayError, int] | None:
        """The refusal and its HTTP status for a wrong path, identity headers, ``Origin``
        or ``Host``; None when the request may go on."""
        if request.scope["path"] != MCP_PATH:
            path = request.scope["path"][:64]
            return InvalidRequest(f"no MCP endpoint at {path}; it is {MCP_PATH}"), 404
        headers = request.headers
        claimed = sorted(self._refused_headers.intersection(headers.keys()))
        if claimed:
            error = Unauthenticated(
                f"the caller is identified by its TLS client certificate only; "
                f"remove the header {claimed[0]}"
            )
            return error, 401
        if "origin" in headers:
            return InvalidRequest("requests from web pages (an Origin header) are refused"), 403
        hosts = headers.getlist("host")
        if len(hosts) > 1 or (self._loopback and hosts and not names_this_machine(hosts[0])):
            return InvalidRequest("the Host header does not name this machine"), 403
        return None

    async def _answer(
        self, request: Request, send: Send, caller: _Caller, message: dict[str, Any]
    ) -> None:
        """``tools/list`` or ``tools/call``, once the SDK's protocol checks pass."""
        modern = checked_era(request, message)
        if isinstance(modern, ProtocolRefusal):
            await self._refuse_protocol(caller, modern.problem)
            if modern.error is None:
                await send_empty(send, modern.status)
            else:
                await send_json(send, error_body(_shown_id(message), modern.error), modern.status)
            return
        method, request_id = message["method"], message["id"]
        params = message.get("params") or {}
        if method == "tools/list":
            if params.get("cursor") is not None:  # one page only: no cursor was ever given
                error = InvalidRequest("unknown cursor: tools/list answers in one page")
                await self._handler.refuse(caller.peer_id, error, "MCP tools/list")
                await self._reply_error(send, request_id, _coded(error, INVALID_PARAMS), modern)
                return
            tools = tools_of(visible_capabilities(caller.grant, self._registry), self._tools)
            result = {"tools": tools, **(_MODERN_LIST if modern else {})}
            await send_json(send, response_body(request_id, result))
            return
        await self._call(request, send, caller, request_id, params, modern)

    async def _refuse_protocol(self, caller: _Caller, problem: str) -> None:
        await self._handler.refuse(caller.peer_id, InvalidRequest(problem), OPERATION)

    async def _call(
        self,
        request: Request,
        send: Send,
        caller: _Caller,
        request_id: str | int,
        params: Mapping[str, Any],
        modern: bool,
    ) -> None:
        """One ``tools/call``: run while the client is there; answer, streamed if it asked for
        progress and takes a stream."""
        call = invoke_call(caller.cert, params, caller.tokens)
        token = (params.get("_meta") or {}).get("progressToken")
        _, takes_stream = check_accept_headers(request)
        stream = EventStream(request.scope, send, self._send_timeout)
        events = None
        if token is not None and takes_stream:
            events = ProgressEvents(token, lambda method, body: _notify(stream, method, body))
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(_cancel_when_gone(request.receive, task))
        status = 200
        try:
            with self.running.running(call_key(caller.peer_id, request_id), task) as entry:
                try:
                    result = await answer_call(self._handler, call, caller.slot, events)
                    answer = response_body(
                        request_id, {**result, **_MODERN_RESULT} if modern else result
                    )
                except JsonRpcRefusal as refusal:
                    answer = error_body(request_id, error_object(refusal.error, refusal.code))
                    status = error_status(refusal.code, modern)
                except asyncio.CancelledError:
                    if not _absorb_cancel(task, entry.cancelled, watcher):
                        raise  # the agent is stopping: the cancellation is its own
                    if not entry.cancelled:
                        return  # the client left: nobody to answer
                    cancelled = Cancelled(CANCELLED_BY_CLIENT)
                    answer = error_body(request_id, error_object(cancelled, GATEWAY_REFUSAL))
        finally:
            watcher.cancel()
        if stream.started:
            with contextlib.suppress(StreamDropped):
                await stream.event(answer, last=True)
        elif not stream.dropped:
            await send_json(send, answer, status)

    async def _reply_error(
        self, send: Send, request_id: Any, error: dict[str, Any], modern: bool
    ) -> None:
        await send_json(send, error_body(request_id, error), error_status(error["code"], modern))

    def _cancel(self, peer_id: str, message: dict[str, Any]) -> None:
        params = message.get("params")
        target = params.get("requestId") if isinstance(params, dict) else None
        if isinstance(target, str | int) and not isinstance(target, bool):
            self.running.cancel(call_key(peer_id, target))


class _Caller:
    """Who is asking, under which grant, and the limit slot the edge took."""

    __slots__ = ("cert", "grant", "peer_id", "slot", "tokens")

    def __init__(
        self,
        peer_id: str,
        grant: PeerGrant,
        slot: EdgeSlot,
        cert: bytes | None,
        tokens: PresentedTokens | None,
    ) -> None:
        self.peer_id = peer_id
        self.grant = grant
        self.slot = slot
        self.cert = cert
        self.tokens = tokens


def _shown_id(message: Mapping[str, Any]) -> str | int | None:
    """The request's id as a refusal echoes it: null unless it is a request id."""
    request_id = message.get("id")
    valid = isinstance(request_id, str | int) and not isinstance(request_id, bool)
    return request_id if valid else None


def _coded(error: GatewayError, code: int) -> dict[str, Any]:
    return error_object(error, code)


async def _body(request: Request, limit: int) -> bytes:
    try:
        async with asyncio.timeout(BODY_SECONDS):
            return await body_within(request, limit)
    except TimeoutError as err:
        raise DeadlineExceeded(
            f"the request body did not arrive within {BODY_SECONDS:g} s"
        ) from err
    except ClientDisconnect as err:
        raise InvalidRequest("the request body was cut off (connection closed)") from err


async def _notify(stream: EventStream, method: str, params: dict[str, Any]) -> None:
    # A stream dropped for a client that stopped reading: the watcher sees the
    # connection go and cancels the call; the capability is not failed for it.
    with contextlib.suppress(StreamDropped):
        await stream.event({"jsonrpc": "2.0", "method": method, "params": params})


async def _cancel_when_gone(receive: Receive, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` once the client has closed the request (its body is read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel(CLIENT_WENT_AWAY)


def _absorb_cancel(
    task: asyncio.Task[Any], by_notification: bool, watcher: asyncio.Task[Any]
) -> bool:
    """True if the cancellation was the client's (it left, or asked): absorbed here."""
    client_left = watcher.done() and not watcher.cancelled()
    if not (client_left or by_notification):
        return False  # the server is stopping: the cancellation is its own
    while task.cancelling():
        task.uncancel()
    return True


def _refeed(body: bytes, then: Receive) -> Callable[[], Awaitable[Message]]:
    """``receive`` for the SDK: the body already read, then the connection's own events."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
