"""The a2a-sdk ``RequestHandler`` of the HTTP bindings: every method is the servicer's.

The SDK's JSON-RPC and REST routes parse the wire and call this handler; it
calls the same ``A2AServicer`` method the gRPC binding calls, with an
:class:`HttpServicerContext`, so identity, request checks, limits, policy,
payload cap, replay, input contract, deadline and the audit record are the
ones of the gRPC binding, decided in one place. A refusal comes back as
:class:`Refused` (an ``A2AError``, so the SDK routes catch it without a
traceback); the edge answers it in the binding's own error form
(``gateway.server.a2a_http.wire_errors``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2
from a2a.utils.errors import A2AError

from gateway.errors import GatewayError
from gateway.server.a2a.servicer import A2AServicer
from gateway.server.a2a_http.context import (
    EXCHANGE_KEY,
    Aborted,
    Exchange,
    HttpServicerContext,
    translated_metadata,
)
from gateway.server.a2a_http.wire_errors import (
    from_grpc_status,
    message_of,
    v0_3_error_data,
)
from gateway.telemetry.sdk_logs import gateway_refused

_Response = TypeVar("_Response")
_STREAM_EVENTS = ("task", "message", "status_update", "artifact_update")
_log = logging.getLogger(__name__)
V0_3_JSONRPC_METHODS = frozenset(JSONRPC03Adapter.METHOD_TO_MODEL)
"""The A2A 0.3 JSON-RPC methods (``message/send`` ...) the SDK's compat layer translates."""


class Refused(A2AError):
    """The servicer refused the request; the edge renders ``error`` for the binding."""

    def __init__(self, error: GatewayError, data: dict[str, Any] | None = None) -> None:
        # ``data``: what the SDK's 0.3 adapter puts in a JSON-RPC error it streams.
        super().__init__(message_of(error), data)
        self.error = error


def speaks_v0_3(state: Mapping[str, Any]) -> bool:
    """True when the SDK's 0.3 compat layer parsed this request (its method, or its REST path).

    ``state``: the call context's (the SDK sets ``method`` there once parsed).
    """
    exchange = state.get(EXCHANGE_KEY)
    method = state.get("method")
    return (isinstance(exchange, Exchange) and exchange.v0_3) or method in V0_3_JSONRPC_METHODS


def exchange_of(context: ServerCallContext) -> Exchange:
    """The edge's record of this request (put there by its context builder)."""
    exchange = context.state.get(EXCHANGE_KEY)
    if not isinstance(exchange, Exchange):
        raise Refused(GatewayError("request did not pass the gateway's edge"))
    return exchange


class ServicerRequestHandler(RequestHandler):
    """Adapts the a2a-sdk request handler interface onto ``A2AServicer``."""

    def __init__(self, servicer: A2AServicer) -> None:
        self._servicer = servicer

    async def _call(
        self,
        method: Callable[[Any, Any], Awaitable[_Response]],
        request: Any,
        context: ServerCallContext,
    ) -> _Response:
        exchange = self._enter(context)
        _carry_tenant(request, context)
        try:
            return await method(request, HttpServicerContext(exchange))
        except Aborted as aborted:
            raise self._refused(exchange, aborted) from None

    @staticmethod
    def _enter(context: ServerCallContext) -> Exchange:
        exchange = exchange_of(context)
        exchange.reached = True  # from here on the servicer audits whatever happens
        if speaks_v0_3(context.state):
            exchange.v0_3 = True
            exchange.metadata = translated_metadata(exchange.metadata)
        request_id = context.state.get("request_id")
        if isinstance(request_id, str | int):
            exchange.request_id = request_id
        return exchange

    @staticmethod
    def _refused(exchange: Exchange, aborted: Aborted) -> Refused:
        error = from_grpc_status(aborted.status)
        exchange.refusal = error
        gateway_refused()  # the SDK logs what follows as its error: it is not the agent's
        return Refused(error, v0_3_error_data(error) if exchange.v0_3 else None)

    async def on_message_send(
        self, params: a2a_pb2.SendMessageRequest, context: ServerCallContext
    ) -> a2a_pb2.Task | a2a_pb2.Message:
        """``SendMessage``: the servicer's answer (a finished task, or a message)."""
        response = await self._call(self._servicer.SendMessage, params, context)
        return response.message if response.HasField("message") else response.task

    async def on_get_task(
        self, params: a2a_pb2.GetTaskRequest, context: ServerCallContext
    ) -> a2a_pb2.Task:
        """``GetTask``: one of the caller's own tasks."""
        return await self._call(self._servicer.GetTask, params, context)

    async def on_list_tasks(
        self, params: a2a_pb2.ListTasksRequest, context: ServerCallContext
    ) -> a2a_pb2.ListTasksResponse:
        """``ListTasks``: the caller's own tasks."""
        return await self._call(self._servicer.ListTasks, params, context)

    async def on_cancel_task(
        self, params: a2a_pb2.CancelTaskRequest, context: ServerCallContext
    ) -> a2a_pb2.Task:
        """``CancelTask``."""
        return await self._call(self._servicer.CancelTask, params, context)

    async def on_get_extended_agent_card(
        self, params: a2a_pb2.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> a2a_pb2.AgentCard:
        """``GetExtendedAgentCard``: the caller's card."""
        return await self._call(self._servicer.GetExtendedAgentCard, params, context)

    async def on_create_task_push_notification_config(
        self, params: a2a_pb2.TaskPushNotificationConfig, context: ServerCallContext
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """As the servicer answers (push notifications are not offered today)."""
        return await self._call(self._servicer.CreateTaskPushNotificationConfig, params, context)

    async def on_get_task_push_notification_config(
        self, params: a2a_pb2.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """As the servicer answers."""
        return await self._call(self._servicer.GetTaskPushNotificationConfig, params, context)

    async def on_list_task_push_notification_configs(
        self, params: a2a_pb2.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> a2a_pb2.ListTaskPushNotificationConfigsResponse:
        """As the servicer answers."""
        return await self._call(self._servicer.ListTaskPushNotificationConfigs, params, context)

    async def on_delete_task_push_notification_config(
        self, params: a2a_pb2.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        """As the servicer answers."""
        await self._call(self._servicer.DeleteTaskPushNotificationConfig, params, context)

    async def on_message_send_stream(
        self, params: a2a_pb2.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        """``SendStreamingMessage``: the servicer's stream, event by event (SSE)."""
        async for event in self._stream(self._servicer.SendStreamingMessage, params, context):
            yield event

    async def on_subscribe_to_task(
        self, params: a2a_pb2.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        """``SubscribeToTask``: the servicer's stream, event by event (SSE)."""
        async for event in self._stream(self._servicer.SubscribeToTask, params, context):
            yield event

    async def _stream(
        self, method: Callable[[Any, Any], Any], request: Any, context: ServerCallContext
    ) -> AsyncIterator[Event]:
        # Both streaming servicer methods are async generators of StreamResponse.
        # An abort before the first event is the edge's error answer; after it,
        # the edge renders the same error as the stream's SSE error event.
        exchange = self._enter(context)
        _carry_tenant(request, context)
        started = False
        try:
            async for response in method(request, HttpServicerContext(exchange)):
                started = True
                yield _event_of(response)
        except Aborted as aborted:
            raise self._refused(exchange, aborted) from None
        except Exception:  # a bug mid-stream: no traceback text on the wire; the log keeps it
            if not started:
                raise
            _log.exception("A2A stream failed after it started")
            exchange.refusal = GatewayError("internal error")
            raise Refused(exchange.refusal) from None


def _carry_tenant(request: Any, context: ServerCallContext) -> None:
    """A tenant in the REST path (``/{tenant}/...``) goes on the request (the servicer refuses)."""
    if context.tenant and hasattr(request, "tenant") and not request.tenant:
        request.tenant = context.tenant


def _event_of(response: Any) -> Event:
    """The one event a ``StreamResponse`` holds (the SDK's routes wrap it again)."""
    which = response.WhichOneof("payload")
    if which not in _STREAM_EVENTS:
        raise Refused(GatewayError("the servicer streamed an empty event"))
    event: Event = getattr(response, which)
    return event
