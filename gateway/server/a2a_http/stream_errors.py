"""An error after an SSE stream has started, in the binding's own error form.

Once the first event is sent, the HTTP status is 200 and cannot change: the
SDK's routes end such a stream with an ``error`` SSE event of their making
(JSON-RPC: code -32603 with the SDK's ``UNKNOWN_ERROR`` details; REST: 500
``INTERNAL``), so our reason code would be lost, and for an unexpected
exception its text would reach the client. The edge therefore replaces every
``error`` event of a stream with the body it answers a refusal with before a
stream starts (``jsonrpc_error`` with the request's id, or ``rest_error``),
for the error the servicer ended the stream with (``Exchange.refusal``);
without one, ``internal error``. The a2a-sdk clients raise that error: a
spec-defined reason as its own exception class, any other with the message,
which starts with our reason code.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.server.a2a_http.context import Exchange

ErrorBody = Callable[[GatewayError], dict[str, Any]]
"""The binding's error body for one error."""


def with_our_stream_errors(response: Response, exchange: Exchange, body: ErrorBody) -> Response:
    """``response``; if it is an SSE stream, its ``error`` events rendered by ``body``."""
    if isinstance(response, EventSourceResponse):
        response.body_iterator = _rendered(response.body_iterator, exchange, body)
    return response


async def _rendered(
    events: AsyncIterable[Any], exchange: Exchange, body: ErrorBody
) -> AsyncIterator[Any]:
    async for event in events:
        if _is_error(event):
            error = exchange.refusal or GatewayError("internal error")
            yield ServerSentEvent(data=json.dumps(body(error)), event="error")
        else:
            yield event


def _is_error(event: Any) -> bool:
    if isinstance(event, ServerSentEvent):
        return event.event == "error"
    return isinstance(event, dict) and event.get("event") == "error"
