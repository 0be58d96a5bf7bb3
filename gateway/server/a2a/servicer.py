"""``lf.a2a.v1.A2AService``: A2A 1.0 over gRPC, a thin adapter onto the InvokeHandler.

Served on the same mTLS port as ``a2agw.v1``. Every method first passes the
pipeline (SendMessage: every check, as Invoke; the others: the Describe
prefix), so identity, policy, payload cap, replay and audit are those of
Invoke; the task methods also take a token of the peer's rate, and a
subscription a place in its ``max_in_flight`` while open. Then, in this
order, a method refuses (audited) an ``a2a-version`` that is not 1.x
(missing means 0.3, as the spec says), a request that did not parse, and a
non-empty tenant. A task is its caller's and its user's: every method on a
task finds it only for the same SPIFFE ID acting for the same user (the
subject and issuer its row keeps), else ``TASK_NOT_FOUND`` as for another
peer's. Push notifications (``[push] enabled``) are the caller's
own: the four push-config methods work on its own tasks, and a SendMessage
carrying a push config stores it for the new task before the task starts
(:mod:`gateway.push`); with push off they are refused with the spec's error.
A blocking SendMessage with a push config runs its task in the background
and answers when it ends, so the webhook gets the events a stream would.

SendMessage refusals before dispatch are gRPC errors; a capability that fails
after admission is a ``TASK_STATE_FAILED`` task carrying the reason code.
``return_immediately`` and ``SendStreamingMessage`` pass the same checks, then
run in the background (:mod:`gateway.server.a2a.background_tasks`);
``SendStreamingMessage`` and ``SubscribeToTask`` are async generators of
``StreamResponse`` (the task first, its events in order, the last terminal;
a SendStreamingMessage's also ends when the task waits for input).

A capability that may ask for input (contract ``asks_input``) runs in the
background for a blocking SendMessage too, which answers the task at its
first interrupted or terminal state (spec 3.2.2). A message naming a
``task_id`` continues that task (:mod:`gateway.server.a2a.conversations`). A
capability that answers with a Message (``MessageReply``) gets the Message
answered and no task kept, when nobody has seen its task yet: a blocking call,
or a stream whose first event is held until the capability's first event
(only for contracts that give messages); ``return_immediately`` answers a
task at once, unless the contract gives messages only (then it runs as a
blocking call).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import empty_pb2
from grpc import aio

from capabilities.registry import CapabilityRegistry
from capabilities.replies import is_message_reply
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PushNotificationNotSupported,
    TaskNotCancelable,
    TaskNotFound,
    UnsupportedOperation,
)
from gateway.inbound.call import InvokeCall, deadline_from
from gateway.inbound.in_flight import current_binding, serving_binding
from gateway.inbound.invoke_handler import (
    AdmittedCall,
    InvokeHandler,
    InvokeOutcome,
    acting_user,
    user_of,
)
from gateway.inbound.limits.admission import CallSlot
from gateway.inbound.pipeline import InFlight
from gateway.push.notifier import PushNotifier
from gateway.server.a2a import history
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.card import CardIssuer, extended_card
from gateway.server.a2a.conversations import Elsewhere, FollowUps, continues_task
from gateway.server.a2a.messages import invoke_call
from gateway.server.a2a.push_wire import config_request, wire_config
from gateway.server.a2a.request_checks import (
    SERVICE_NAME,
    protocol_version,
    request_problem,
    safe_id,
    speaks_1_0,
    task_filter,
    task_id_of,
)
from gateway.server.a2a.task_events import BackgroundTask
from gateway.server.a2a.task_follow import follow_deadline, followed
from gateway.server.a2a.task_store.store import (
    A2ATask,
    A2ATaskStore,
    TaskFilter,
    TaskOutcome,
    TaskPage,
    TaskUser,
    page_size,
)
from gateway.server.a2a.task_view import list_answer, message_answer, send_answer, task_message
from gateway.server.a2a.wire_errors import to_a2a_status
from gateway.server.a2a.wire_parts import parts_json
from gateway.server.received import MalformedRequest, edge_slot, peer_cert, request_tokens
from gateway.telemetry import Telemetry
from gateway.telemetry.tracing import mark_refused
from policies.grants import PeerGrant

_TASK_NOT_FOUND = "task not found"
_FINISHED = "the task has already finished; use GetTask"
_FINISHED_CANCEL = "the task has already finished"
_NO_PUSH = "push notifications are not supported by this agent"
FALLBACK_TIMEOUT_SECONDS = 3600.0
"""Followed tasks of a capability this process does not have (a different deployment)."""
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
        default_capability: str = "",
        runs: BackgroundTasks | None = None,
        push: PushNotifier | None = None,
    ) -> None:
        self._push = push  # None: [push] is off
        self._default_capability = default_capability  # [a2a] default_capability
        self._telemetry = telemetry if telemetry is not None else Telemetry.off(agent_id)
        self._agent_id = agent_id
        self._handler = handler
        self._tasks = tasks
        self._registry = registry
        self._address = address
        self.runs = runs if runs is not None else BackgroundTasks(handler, tasks)
        """The background and streamed tasks this servicer started."""
        self._follow_ups = FollowUps(handler, tasks, self.runs, self._admit_caller)

    # --- the common path ------------------------------------------------------

    async def _answer(
        self, context: aio.ServicerContext[Any, Any], operation: str, work: Awaitable[_T]
    ) -> _T:
        """Await ``work`` in a span; a GatewayError becomes its status, anything else INTERNAL."""
        if not current_binding():  # the HTTP edge names its binding before it gets here
            serving_binding("A2A gRPC")
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
        peer_id, _ = await self._admit_caller(request, context, operation)
        return peer_id

    async def _admit_caller(
        self, request: object, context: aio.ServicerContext[Any, Any], operation: str
    ) -> tuple[str, TaskUser]:
        """``_admit``; returns the caller's SPIFFE ID and the user it acts for."""
        tokens = request_tokens(context)
        peer_id, _ = await self._handler.admit_peer(
            peer_cert(context),
            f"A2A {operation}",
            task_id_of(request),
            edge_slot=edge_slot(context),
            tokens=tokens,
        )
        await self._a2a_checks(request, context, peer_id, operation)
        return peer_id, user_of(tokens)

    async def _admit_limited(
        self,
        request: object,
        context: aio.ServicerContext[Any, Any],
        operation: str,
        *,
        in_flight: bool = False,
    ) -> tuple[str, TaskUser, CallSlot]:
        """``_admit_caller`` for a task operation, with the limits of its kind.

        A poll (``in_flight`` false) takes a token of the peer's rate but needs no
        room under its ``max_in_flight`` (its own running tasks may hold every
        place); a subscription also holds the returned slot while open (release
        it when it ends).
        """
        kind = InFlight.HOLD if in_flight else InFlight.POLL
        tokens = request_tokens(context)
        peer_id, slot = await self._handler.admit_task_reader(
            peer_cert(context),
            f"A2A {operation}",
            task_id_of(request),
            kind,
            edge_slot=edge_slot(context),
            tokens=tokens,
        )
        try:
            await self._a2a_checks(request, context, peer_id, operation)
        except BaseException:
            slot.release()
            raise
        return peer_id, user_of(tokens), slot

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
        if continues_task(request):
            assert isinstance(request, a2a_pb2.SendMessageRequest)
            continued = await self._follow_ups.accept(request, context, "SendMessage")
            immediately = request.configuration.return_immediately
            if isinstance(continued, Elsewhere):  # followed through the store
                asked = continued.asked
                deadline = follow_deadline(asked, self._timeout_of(asked))
                latest = await self._follow_ups.after(asked, deadline, settled=not immediately)
                return send_answer(latest, _history_length(request))
            if immediately:
                return send_answer(continued.task, _history_length(request))
            return await self._settled_answer(continued, request)
        admitted, submitted = await self._admit_message(request, context, "SendMessage")
        pushed = await self._attach_push(request, admitted, submitted, "SendMessage")
        contract = admitted.admission.capability.contract
        immediately = (
            not isinstance(request, MalformedRequest)
            and request.configuration.return_immediately
            and not contract.gives.messages_only
        )
        if immediately:
            run = await self._start(submitted, admitted, "SendMessage")
            return send_answer(run.task, _history_length(request))
        if contract.asks_input or pushed:
            # It may wait for the caller, or its webhook gets the events a stream would:
            # the run outlives this RPC, which answers at its first interrupted or final state.
            # Quiet even with a webhook: a Message answer keeps no task (the webhook gets
            # that Message, its one notification).
            quiet = contract.gives.messages
            run = await self._start(submitted, admitted, "SendMessage", quiet=quiet)
            return await self._settled_answer(run, request)
        outcome: InvokeOutcome | None = None
        failure: GatewayError | None = None
        try:
            outcome = await self._handler.run(admitted)
        except GatewayError as err:  # after admission: a failed task, not a gRPC error
            failure = err
        task = replace(
            submitted,
            state=TaskOutcome.FAILED if outcome is None else TaskOutcome.COMPLETED,
            output=b"" if outcome is None else outcome.payload,
            evidence_sha256="" if outcome is None else outcome.evidence_sha256,
            remembered=outcome is not None and outcome.remembered,
            reason="OK" if failure is None else failure.reason,
            message="" if failure is None else failure.message,
            updated_ms=int(time.time() * 1000),
        )
        if outcome is not None and is_message_reply(outcome.payload):
            return message_answer(task)  # a Message answer: no task is kept
        self._tasks.put(task)
        if self.runs.shared:  # the caller's next request may reach another process
            await self._tasks.flush()
        return send_answer(task, _history_length(request))

    async def _settled_answer(
        self, run: BackgroundTask, request: a2a_pb2.SendMessageRequest | MalformedRequest
    ) -> a2a_pb2.SendMessageResponse:
        """A blocking send's answer: the task at its next interrupted or terminal state
        (or the Message it was answered with). The run goes on if this RPC ends first."""
        settled = await run.next_settled()
        if run.message_only:
            return message_answer(settled)
        return send_answer(settled, _history_length(request))

    async def _admit_message(
        self,
        request: a2a_pb2.SendMessageRequest | MalformedRequest,
        context: aio.ServicerContext[Any, Any],
        operation: str,
    ) -> tuple[AdmittedCall, A2ATask]:
        """Every check of the pipeline for a message; the admitted call and its new task."""
        if not speaks_1_0(protocol_version(context)):
            await self._admit(request, context, operation)  # refuses, audited
        malformed = isinstance(request, MalformedRequest)
        parsed = a2a_pb2.SendMessageRequest() if malformed else request
        assert isinstance(parsed, a2a_pb2.SendMessageRequest)
        task_id = str(uuid.uuid4())
        context_id = parsed.message.context_id or str(uuid.uuid4())
        call = invoke_call(
            parsed,
            peer_cert_pem=peer_cert(context),
            deadline=deadline_from(context.time_remaining(), 0),
            task_id=task_id,
            default_capability=self._default_capability,
            context_id=context_id,
            tokens=request_tokens(context),
        )
        if malformed:
            call = _with_problem(call, f"the request is not a valid {SERVICE_NAME} {operation}")
        admitted = await self._handler.admit(call, edge_slot=edge_slot(context))
        now_ms = int(time.time() * 1000)
        user = acting_user(admitted.call)  # kept on the task: only that user finds it again
        kept = b""
        if admitted.admission.capability.contract.asks_input and admitted.call.message:
            parts = parts_json(admitted.call.message.parts())
            kept = history.appended(b"", "user", admitted.call.request_id, parts)
        task = A2ATask(
            task_id=task_id,
            owner=admitted.admission.peer_id,
            context_id=context_id,
            state=TaskOutcome.SUBMITTED,
            capability=call.capability,
            served_version=str(admitted.admission.capability.version),
            output=b"",
            evidence_sha256="",
            remembered=False,
            reason="",
            message="",
            created_ms=now_ms,
            updated_ms=now_ms,
            history=kept,
            on_behalf_of=user[0],
            user_issuer=user[1],
        )
        return admitted, task

    async def _attach_push(
        self,
        request: a2a_pb2.SendMessageRequest | MalformedRequest,
        admitted: AdmittedCall,
        task: A2ATask,
        operation: str,
    ) -> bool:
        """Store the message's push config for its new task (True), before the task starts.

        A refusal gives the call's slot back and is audited; nothing runs.
        """
        if isinstance(request, MalformedRequest):
            return False
        if not request.configuration.HasField("task_push_notification_config"):
            return False
        wire = request.configuration.task_push_notification_config
        try:
            if self._push is None:
                raise PushNotificationNotSupported(_NO_PUSH)
            if wire.tenant:
                raise InvalidRequest(
                    "tenants are not supported by this agent; send an empty tenant"
                )
            grant = admitted.admission.grant
            asked = config_request(wire)
            await self._push.create(task.owner, grant, task.task_id, asked, operation, follow=True)
        except GatewayError as err:  # nothing ran: one refusal record, as before dispatch
            if admitted.slot is not None:
                admitted.slot.release()
            raise await self._handler.refuse(
                task.owner, err, f"A2A {operation}", task.task_id
            ) from err
        return True

    async def _start(
        self, task: A2ATask, admitted: AdmittedCall, operation: str, *, quiet: bool = False
    ) -> BackgroundTask:
        """Start ``admitted`` in the background; a failure to start is audited and raised."""
        try:
            return await self.runs.start(task, _unhurried(admitted), quiet=quiet)
        except GatewayError as err:  # nothing ran: one refusal record, as before dispatch
            raise await self._handler.refuse(
                task.owner, err, f"A2A {operation}", task.task_id
            ) from err

    # --- streams --------------------------------------------------------------

    async def SendStreamingMessage(
        self, request: a2a_pb2.SendMessageRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        """SendMessage run in the background, streamed: the task, then its events, up to
        its end or its next interrupted state (or the one Message it was answered with)."""

        async def work() -> AsyncIterator[a2a_pb2.StreamResponse]:
            if continues_task(request):
                continued = await self._follow_ups.accept(request, context, "SendStreamingMessage")
                if isinstance(continued, Elsewhere):  # followed through the store
                    asked = continued.asked
                    deadline = follow_deadline(asked, self._timeout_of(asked))
                    latest = await self._follow_ups.after(asked, deadline, settled=False)
                    stopping = self.runs.stopping
                    return followed(self._tasks, latest, deadline, stopping, until_waiting=True)
                return continued.listen(until_waiting=True).events()  # no await since hand-over
            admitted, submitted = await self._admit_message(
                request, context, "SendStreamingMessage"
            )
            await self._attach_push(request, admitted, submitted, "SendStreamingMessage")
            quiet = admitted.admission.capability.contract.gives.messages  # see _send
            run = await self._start(submitted, admitted, "SendStreamingMessage", quiet=quiet)
            events = run.listen(until_waiting=True).events()  # no await since start
            return _message_or_task(events) if quiet else events

        events = await self._answer(context, "SendStreamingMessage", work())
        async for event in events:
            yield event

    async def SubscribeToTask(
        self, request: a2a_pb2.SubscribeToTaskRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        """Follow one of the caller's running tasks: the task as it is now, then its events.

        Counts as one call in flight of the caller while open. A task another
        process of this agent runs (workers, replicas) is followed through the
        store (:mod:`gateway.server.a2a.task_follow`). A finished task is
        UNSUPPORTED_OPERATION.
        """

        async def work() -> tuple[AsyncIterator[a2a_pb2.StreamResponse], str, CallSlot]:
            # The events, the caller, and the place it holds while they flow.
            peer_id, user, slot = await self._admit_limited(
                request, context, "SubscribeToTask", in_flight=True
            )
            try:
                stored = await self._owned(peer_id, user, request.id, "SubscribeToTask")
                run = self.runs.running(stored.task_id)
                if run is not None and not run.task.state.finished:
                    return run.listen().events(), peer_id, slot
                if run is None and not stored.state.finished:
                    deadline = follow_deadline(stored, self._timeout_of(stored))
                    events = followed(self._tasks, stored, deadline, self.runs.stopping)
                    return events, peer_id, slot
                raise await self._handler.refuse(
                    peer_id, UnsupportedOperation(_FINISHED), "A2A SubscribeToTask", stored.task_id
                )
            except BaseException:
                slot.release()
                raise

        events, peer_id, slot = await self._answer(context, "SubscribeToTask", work())
        try:
            async for event in events:
                yield event
        except GatewayError as err:  # after the first event: the stream ends with this error
            slot.release()  # before the caller hears the end, so its next call finds the room
            await self._handler.refuse(peer_id, err, "A2A SubscribeToTask", safe_id(request.id))
            await _abort(context, err)
        finally:
            slot.release()

    def _timeout_of(self, task: A2ATask) -> float:
        """The contract timeout of the capability version that runs ``task``."""
        for cap in self._registry:
            if cap.name == task.capability and str(cap.version) == task.served_version:
                return cap.contract.timeout_seconds
        return FALLBACK_TIMEOUT_SECONDS

    # --- the card -------------------------------------------------------------

    async def GetExtendedAgentCard(
        self, request: a2a_pb2.GetExtendedAgentCardRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.AgentCard:
        """The card for the calling peer: the skills its grant allows, and their contracts."""

        async def work() -> a2a_pb2.AgentCard:
            grant, admissions = await self._handler.describe(
                peer_cert(context),
                "A2A GetExtendedAgentCard",
                edge_slot=edge_slot(context),
                tokens=request_tokens(context),
            )
            await self._a2a_checks(request, context, grant.peer, "GetExtendedAgentCard")
            visible = [admission.capability for admission in admissions]
            return extended_card(self._agent_id, self._address(), grant, visible)

        return await self._answer(context, "GetExtendedAgentCard", work())

    # --- tasks ----------------------------------------------------------------

    async def GetTask(
        self, request: a2a_pb2.GetTaskRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.Task:
        """One of the caller's own tasks; another peer's (or user's) is TASK_NOT_FOUND."""

        async def work() -> a2a_pb2.Task:
            peer_id, user, _ = await self._admit_limited(request, context, "GetTask")
            stored = await self._owned(peer_id, user, request.id, "GetTask")
            asked = _history_length(request)
            if asked is not None and asked < 0:
                raise await self._handler.refuse(
                    peer_id, InvalidRequest(_NEGATIVE_HISTORY), "A2A GetTask", stored.task_id
                )
            run = self.runs.running(stored.task_id)
            return task_message(stored if run is None else run.task, history_length=asked)

        return await self._answer(context, "GetTask", work())

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.Task:
        """Cancel one of the caller's running tasks; a finished one is TASK_NOT_CANCELABLE."""

        async def work() -> a2a_pb2.Task:
            peer_id, user, _ = await self._admit_limited(request, context, "CancelTask")
            stored = await self._owned(peer_id, user, request.id, "CancelTask")
            run = self.runs.running(stored.task_id)
            try:
                if run is not None:
                    return task_message(await self.runs.cancel(run, peer_id))
                if stored.state.finished:
                    raise TaskNotCancelable(_FINISHED_CANCEL)
                return task_message(await self.runs.cancel_elsewhere(stored, peer_id))
            except TaskNotCancelable as err:
                raise await self._handler.refuse(
                    peer_id, err, "A2A CancelTask", stored.task_id
                ) from err

        return await self._answer(context, "CancelTask", work())

    async def ListTasks(
        self, request: a2a_pb2.ListTasksRequest, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.ListTasksResponse:
        """The caller's own tasks (started for the user it acts for), last updated first."""

        async def work() -> a2a_pb2.ListTasksResponse:
            peer_id, user, _ = await self._admit_limited(request, context, "ListTasks")
            history_length = _history_length(request)
            try:
                if history_length is not None and history_length < 0:
                    raise InvalidRequest(_NEGATIVE_HISTORY)
                wanted = task_filter(request)
                if wanted is None:  # a state no task here is ever in: an empty page
                    has_size = request.HasField("page_size")
                    asked = TaskFilter(page_size=request.page_size) if has_size else TaskFilter()
                    page = TaskPage([], "", 0, page_size(asked))
                else:
                    page = await self._tasks.list(peer_id, wanted, user)
            except GatewayError as err:
                raise await self._handler.refuse(peer_id, err, "A2A ListTasks") from err
            include = request.include_artifacts if request.HasField("include_artifacts") else False
            return list_answer(page, include_artifacts=include, history_length=history_length)

        return await self._answer(context, "ListTasks", work())

    async def _owned(self, peer_id: str, user: TaskUser, task_id: str, operation: str) -> A2ATask:
        # One query names owner, user and id, so another peer's task, another user's
        # task of the same peer and a task that never existed take the same path to
        # the same answer.
        try:
            task = await self._tasks.get(peer_id, task_id, user)
        except GatewayError as err:
            raise await self._handler.refuse(peer_id, err, f"A2A {operation}") from err
        if task is None:
            raise await self._handler.refuse(
                peer_id, TaskNotFound(_TASK_NOT_FOUND), f"A2A {operation}", safe_id(task_id)
            )
        return task

    # --- push notifications ---------------------------------------------------

    async def CreateTaskPushNotificationConfig(
        self, request: a2a_pb2.TaskPushNotificationConfig, context: aio.ServicerContext[Any, Any]
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """Push the events of one of the caller's tasks to a webhook its grant names."""
        operation = "CreateTaskPushNotificationConfig"

        async def work(push: PushNotifier) -> a2a_pb2.TaskPushNotificationConfig:
            peer_id, grant, task = await self._push_task(request, context, operation)
            asked = config_request(request)
            follow = not task.state.finished
            made = push.create(peer_id, grant, task.task_id, asked, operation, follow=follow)
            return wire_config(await self._pushing(peer_id, operation, task, made))

        return await self._push_method(request, context, operation, work)

    async def GetTaskPushNotificationConfig(
        self,
        request: a2a_pb2.GetTaskPushNotificationConfigRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """One push config of one of the caller's tasks (unknown: TASK_NOT_FOUND)."""
        operation = "GetTaskPushNotificationConfig"

        async def work(push: PushNotifier) -> a2a_pb2.TaskPushNotificationConfig:
            peer_id, _, task = await self._push_task(request, context, operation)
            found = push.get(peer_id, task.task_id, request.id)
            return wire_config(await self._pushing(peer_id, operation, task, found))

        return await self._push_method(request, context, operation, work)

    async def ListTaskPushNotificationConfigs(
        self,
        request: a2a_pb2.ListTaskPushNotificationConfigsRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> a2a_pb2.ListTaskPushNotificationConfigsResponse:
        """Every push config of one of the caller's tasks, in one page."""
        operation = "ListTaskPushNotificationConfigs"

        async def work(push: PushNotifier) -> a2a_pb2.ListTaskPushNotificationConfigsResponse:
            peer_id, _, task = await self._push_task(request, context, operation)
            listed = await self._pushing(
                peer_id, operation, task, push.list_configs(peer_id, task.task_id)
            )
            return a2a_pb2.ListTaskPushNotificationConfigsResponse(
                configs=[wire_config(config) for config in listed]
            )

        return await self._push_method(request, context, operation, work)

    async def DeleteTaskPushNotificationConfig(
        self,
        request: a2a_pb2.DeleteTaskPushNotificationConfigRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> empty_pb2.Empty:
        """Forget a push config of one of the caller's tasks (idempotent)."""
        operation = "DeleteTaskPushNotificationConfig"

        async def work(push: PushNotifier) -> empty_pb2.Empty:
            peer_id, _, task = await self._push_task(request, context, operation)
            deleted = push.delete(peer_id, task.task_id, request.id, operation)
            await self._pushing(peer_id, operation, task, deleted)
            return empty_pb2.Empty()

        return await self._push_method(request, context, operation, work)

    async def _push_method(
        self,
        request: Any,
        context: aio.ServicerContext[Any, Any],
        operation: str,
        work: Callable[[PushNotifier], Awaitable[_T]],
    ) -> _T:
        if self._push is None:
            await self._refuse(context, request, operation, PushNotificationNotSupported(_NO_PUSH))
        assert self._push is not None
        return await self._answer(context, operation, work(self._push))

    async def _push_task(
        self, request: Any, context: aio.ServicerContext[Any, Any], operation: str
    ) -> tuple[str, PeerGrant, A2ATask]:
        """The Describe prefix, the A2A checks, then the caller's own task ``request.task_id``
        (started for the user the caller acts for now)."""
        tokens = request_tokens(context)  # the caller as every other method knows it
        peer_id, grant = await self._handler.admit_peer(
            peer_cert(context),
            f"A2A {operation}",
            task_id_of(request),
            edge_slot=edge_slot(context),
            tokens=tokens,
        )
        await self._a2a_checks(request, context, peer_id, operation)  # refuses unparsed bytes
        task = await self._owned(peer_id, user_of(tokens), request.task_id, operation)
        return peer_id, grant, task

    async def _pushing(
        self, peer_id: str, operation: str, task: A2ATask, work: Awaitable[_T]
    ) -> _T:
        """``work``'s answer; its refusal audited (task ``task``)."""
        try:
            return await work
        except GatewayError as err:
            raise await self._handler.refuse(
                peer_id, err, f"A2A {operation}", task.task_id
            ) from err


def _with_problem(call: InvokeCall, problem: str) -> InvokeCall:
    return call.with_problem(problem)


_NEGATIVE_HISTORY = "history_length must not be negative"


def _history_length(request: object) -> int | None:
    """The ``history_length`` a request asks for (None: unset, the whole history)."""
    if isinstance(request, a2a_pb2.SendMessageRequest):
        configuration = request.configuration
        return configuration.history_length if configuration.HasField("history_length") else None
    if isinstance(request, a2a_pb2.GetTaskRequest | a2a_pb2.ListTasksRequest):
        return request.history_length if request.HasField("history_length") else None
    return None


async def _message_or_task(
    events: AsyncIterator[a2a_pb2.StreamResponse],
) -> AsyncIterator[a2a_pb2.StreamResponse]:
    """A quiet run's stream: the one Message, if the capability answered with it before
    anything else, else the task (held until then) and every event after it."""
    task = await anext(events)
    following = await anext(events, None)
    if following is not None and following.HasField("message"):
        yield following
        return
    yield task
    if following is not None:
        yield following
    async for event in events:
        yield event


def _unhurried(admitted: AdmittedCall) -> AdmittedCall:
    """``admitted`` with the contract timeout as its only deadline (it outlives the RPC)."""
    timeout = admitted.admission.capability.contract.timeout_seconds
    # A second past the timeout, so the contract timeout is what fires.
    deadline = time.monotonic() + timeout + 1.0
    return replace(admitted, call=admitted.call.with_deadline(deadline))
