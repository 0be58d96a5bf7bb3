"""``lf.a2a.v1.A2AService``: A2A 1.0 over gRPC, a thin adapter onto the InvokeHandler.

Served on the same mTLS port as ``a2agw.v1``. Every method first passes the
pipeline (SendMessage: every check, as Invoke; the others: the Describe
prefix), so identity, policy, payload cap, replay and audit are those of
Invoke. Then, in this order, a method refuses (audited) an ``a2a-version``
that is not 1.x (missing means 0.3, as the spec says), a request that did
not parse, and a non-empty tenant. What we do not offer (streaming,
subscriptions, push notifications) is answered with the spec's error.

SendMessage refusals before dispatch are gRPC errors; a capability that fails
after admission is a ``TASK_STATE_FAILED`` task carrying the reason code.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import empty_pb2
from grpc import aio

from capabilities.registry import CapabilityRegistry
from gateway.errors import (
    GatewayError,
    PushNotificationNotSupported,
    TaskNotCancelable,
    TaskNotFound,
    UnsupportedOperation,
)
from gateway.inbound.call import InvokeCall, deadline_from
from gateway.inbound.invoke_handler import InvokeHandler, InvokeOutcome
from gateway.telemetry import Telemetry
from gateway.telemetry.tracing import mark_refused
from gateway.transport.a2a.card import CardIssuer, extended_card
from gateway.transport.a2a.messages import invoke_call, task_message
from gateway.transport.a2a.request_checks import (
    SERVICE_NAME,
    protocol_version,
    request_problem,
    safe_id,
    speaks_1x,
    task_filter,
    task_id_of,
)
from gateway.transport.a2a.task_store import (
    A2ATask,
    A2ATaskStore,
    TaskOutcome,
    TaskPage,
)
from gateway.transport.a2a.wire_errors import to_a2a_status
from gateway.transport.received import MalformedRequest, peer_cert

_TASK_NOT_FOUND = "task not found"
_T = TypeVar("_T")
_log = logging.getLogger(__name__)


async def _abort(context: aio.ServicerContext[Any, Any], error: GatewayError) -> NoReturn:
    await context.abort_with_status(to_a2a_status(error))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


class A2AServicer(a2a_pb2_grpc.A2AServiceServicer):
    """Adapts ``A2AService`` RPCs to the InvokeHandler and the A2A task table."""

    def __init__(
        self,
        agent_id: str,
        handler: InvokeHandler,
        tasks: A2ATaskStore,
        registry: CapabilityRegistry,
        address: Callable[[], str | CardIssuer],
        telemetry: Telemetry | None = None,
    ) -> None:
        self._telemetry = telemetry if telemetry is not None else Telemetry.off(agent_id)
        self._agent_id = agent_id
        self._handler = handler
        self._tasks = tasks
        self._registry = registry
        self._address = address

    # --- the common path ------------------------------------------------------

    async def _answer(
        self, context: aio.ServicerContext[Any, Any], operation: str, work: Awaitable[_T]
    ) -> _T:
        """Await ``work`` in a span; a GatewayError becomes its status, anything else INTERNAL."""
        name = f"A2A {operation}"
        with self._telemetry.inbound(
            name, context.invocation_metadata(), {"rpc.method": operation}
        ) as span:
            try:
                return await work
            except GatewayError as err:
                mark_refused(span, err)
                await _abort(context, err)
            except Exception:  # never a traceback on the wire; the log keeps it
                _log.exception("A2A %s failed", operation)
                await _abort(context, GatewayError("internal error"))

    async def _admit(
        self, request: object, context: aio.ServicerContext[Any, Any], operation: str
    ) -> str:
        """Describe prefix, then the A2A checks; returns the caller's SPIFFE ID."""
        peer_id, _ = await self._handler.admit_peer(
            peer_cert(context), f"A2A {operation}", task_id_of(request)
        )
        await self._a2a_checks(request, context, peer_id, operation)
        return peer_id

    async def _a2a_checks(
        self, request: object, context: aio.ServicerContext[Any, Any], peer_id: str, operation: str
    ) -> None:
        """Protocol version, parsable request, no tenant; a refusal is audited."""
        problem = request_problem(request, protocol_version(context), operation)
        if problem is not None:
            raise await self._handler.refuse(
                peer_id, problem, f"A2A {operation}", task_id_of(request)
            )

    async def _refuse(
        self,
        context: aio.ServicerContext[Any, Any],
        request: object,
        operation: str,
        error: GatewayError,
    ) -> NoReturn:
        async def work() -> None:
            peer_id = await self._admit(request, context, operation)
            raise await self._handler.refuse(peer_id, error, f"A2A {operation}")

        await self._answer(context, operation, work())
        raise AssertionError("refusal answered")  # pragma: no cover

    # --- SendMessage ----------------------------------------------------------

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.SendMessageResponse:
        """Run one capability for the calling peer; the answer is a finished task."""
        return await self._answer(context, "SendMessage", self._send(request, context))

    async def _send(
        self,
        request: a2a_pb2.SendMessageRequest | MalformedRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> a2a_pb2.SendMessageResponse:
        if not speaks_1x(protocol_version(context)):
            await self._admit(request, context, "SendMessage")  # refuses, audited
        malformed = isinstance(request, MalformedRequest)
        parsed = a2a_pb2.SendMessageRequest() if malformed else request
        assert isinstance(parsed, a2a_pb2.SendMessageRequest)
        task_id = str(uuid.uuid4())
        call = invoke_call(
            parsed,
            peer_cert_pem=peer_cert(context),
            deadline=deadline_from(context.time_remaining(), 0),
            task_id=task_id,
            input_models=self._input_models,
        )
        if malformed:
            call = _with_problem(call, f"the request is not a valid {SERVICE_NAME} SendMessage")
        admitted = await self._handler.admit(call)
        created_ms = int(time.time() * 1000)
        context_id = parsed.message.context_id or str(uuid.uuid4())
        outcome: InvokeOutcome | None = None
        failure: GatewayError | None = None
        try:
            outcome = await self._handler.run(admitted)
        except GatewayError as err:  # after admission: a failed task, not a gRPC error
            failure = err
        task = A2ATask(
            task_id=task_id,
            owner=admitted.admission.peer_id,
            context_id=context_id,
            state=TaskOutcome.FAILED if outcome is None else TaskOutcome.COMPLETED,
            capability=call.capability,
            served_version=str(admitted.admission.capability.version),
            output=b"" if outcome is None else outcome.payload,
            evidence_sha256="" if outcome is None else outcome.evidence_sha256,
            replayed=outcome is not None and outcome.replayed,
            reason="OK" if failure is None else failure.reason,
            message="" if failure is None else failure.message,
            created_ms=created_ms,
            updated_ms=int(time.time() * 1000),
        )
        self._tasks.put(task)
        return a2a_pb2.SendMessageResponse(task=task_message(task))

    def _input_models(self, capability: str) -> list[Any]:
        return [cap.contract.input_model for cap in self._registry if cap.name == capability]

    # --- the card -------------------------------------------------------------

    async def GetExtendedAgentCard(
        self, request: a2a_pb2.GetExtendedAgentCardRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.AgentCard:
        """The card for the calling peer: the skills its grant allows, and their contracts."""

        async def work() -> a2a_pb2.AgentCard:
            grant, admissions = await self._handler.describe(
                peer_cert(context), "A2A GetExtendedAgentCard"
            )
            await self._a2a_checks(request, context, grant.peer, "GetExtendedAgentCard")
            visible = [admission.capability for admission in admissions]
            return extended_card(self._agent_id, self._address(), grant, visible)

        return await self._answer(context, "GetExtendedAgentCard", work())

    # --- tasks ----------------------------------------------------------------

    async def GetTask(
        self, request: a2a_pb2.GetTaskRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.Task:
        """One of the caller's own tasks; another peer's is TASK_NOT_FOUND."""

        async def work() -> a2a_pb2.Task:
            peer_id = await self._admit(request, context, "GetTask")
            return task_message(await self._owned(peer_id, request.id, "GetTask"))

        return await self._answer(context, "GetTask", work())

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.Task:
        """Every task here has finished by the time its id is known: TASK_NOT_CANCELABLE."""

        async def work() -> a2a_pb2.Task:
            peer_id = await self._admit(request, context, "CancelTask")
            await self._owned(peer_id, request.id, "CancelTask")
            raise await self._handler.refuse(
                peer_id,
                TaskNotCancelable("the task has already finished"),
                "A2A CancelTask",
                task_id_of(request),
            )

        return await self._answer(context, "CancelTask", work())

    async def ListTasks(
        self, request: a2a_pb2.ListTasksRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.ListTasksResponse:
        """The caller's own tasks, newest first."""

        async def work() -> a2a_pb2.ListTasksResponse:
            peer_id = await self._admit(request, context, "ListTasks")
            wanted = task_filter(request)
            try:
                page = (
                    TaskPage([], "", 0)
                    if wanted is None
                    else await self._tasks.list(peer_id, wanted)
                )
            except GatewayError as err:
                raise await self._handler.refuse(peer_id, err, "A2A ListTasks") from err
            include = request.include_artifacts if request.HasField("include_artifacts") else False
            return a2a_pb2.ListTasksResponse(
                tasks=[task_message(task, include_artifacts=include) for task in page.tasks],
                next_page_token=page.next_page_token,
                page_size=len(page.tasks),
                total_size=page.total_size,
            )

        return await self._answer(context, "ListTasks", work())

    async def _owned(self, peer_id: str, task_id: str, operation: str) -> A2ATask:
        # One query names both owner and id, so another peer's task and a task
        # that never existed take the same path to the same answer.
        try:
            task = await self._tasks.get(peer_id, task_id)
        except GatewayError as err:
            raise await self._handler.refuse(peer_id, err, f"A2A {operation}") from err
        if task is None:
            raise await self._handler.refuse(
                peer_id, TaskNotFound(_TASK_NOT_FOUND), f"A2A {operation}", safe_id(task_id)
            )
        return task

    # --- what we do not offer -------------------------------------------------

    async def SendStreamingMessage(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> None:
        """Streaming is not offered: UNSUPPORTED_OPERATION (use SendMessage)."""
        await self._refuse(
            context,
            request,
            "SendStreamingMessage",
            UnsupportedOperation("streaming is not supported; use SendMessage"),
        )

    async def SubscribeToTask(self, request: Any, context: aio.ServicerContext[Any, Any]) -> None:
        """Subscriptions are not offered: UNSUPPORTED_OPERATION (tasks finish in SendMessage)."""
        await self._refuse(
            context,
            request,
            "SubscribeToTask",
            UnsupportedOperation("task subscriptions are not supported; use GetTask"),
        )

    async def CreateTaskPushNotificationConfig(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """PUSH_NOTIFICATION_NOT_SUPPORTED."""
        await self._no_push(request, context, "CreateTaskPushNotificationConfig")

    async def GetTaskPushNotificationConfig(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """PUSH_NOTIFICATION_NOT_SUPPORTED."""
        await self._no_push(request, context, "GetTaskPushNotificationConfig")

    async def ListTaskPushNotificationConfigs(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.ListTaskPushNotificationConfigsResponse:
        """PUSH_NOTIFICATION_NOT_SUPPORTED."""
        await self._no_push(request, context, "ListTaskPushNotificationConfigs")

    async def DeleteTaskPushNotificationConfig(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> empty_pb2.Empty:
        """PUSH_NOTIFICATION_NOT_SUPPORTED."""
        await self._no_push(request, context, "DeleteTaskPushNotificationConfig")

    async def _no_push(
        self, request: Any, context: aio.ServicerContext[Any, Any], operation: str
    ) -> NoReturn:
        await self._refuse(
            context,
            request,
            operation,
            PushNotificationNotSupported("push notifications are not supported by this agent"),
        )


def _with_problem(call: InvokeCall, problem: str) -> InvokeCall:
    return replace(call, problem=problem)
