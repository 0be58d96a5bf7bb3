"""Messages that continue a task: the caller's answers to ``ctx.ask_input``.

A SendMessage (or SendStreamingMessage) whose message names a ``task_id``
continues that task, and only:

* the task's owner may (another peer's task id, or one that never existed,
  is ``TASK_NOT_FOUND``: the same answer, code path and audit record);
* while the task waits for input (``INPUT_REQUIRED``, or ``AUTH_REQUIRED``
  asked with ``ctx.ask_input``); a finished task, or one working and not
  waiting, is ``UNSUPPORTED_OPERATION`` (spec 3.1.1; the a2a-sdk answers so);
* through the whole decision order, as a first message: identity, request
  checks (a ``context_id`` other than the task's is ``INVALID_REQUEST``, spec
  3.4.3; none means the task's), limits (a rate token; no free place under
  ``max_in_flight`` is needed, since the task itself holds one), the grant for
  the task's capability at the version that serves it, the payload cap over
  all parts, the parts its contract accepts, replay of ``message_id``, and its
  content validated against the schema the capability asked with. A refusal
  is one audit record and leaves the task waiting.

An admitted follow-up is claimed for the question it answers (a second one
racing it finds the question taken: ``UNSUPPORTED_OPERATION``), audited
``allow``/``OK`` (committed first for a capability that may write: it resumes
one), then handed to the capability, whose task is ``WORKING`` again.

The task must be running in this process. With workers or replicas a
follow-up reaching another process than the one the task waits in is
``UNSUPPORTED_OPERATION`` (the task keeps waiting; see docs/a2a.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from a2a.types import a2a_pb2
from grpc import aio

from capabilities.parts import AnyObject
from gateway.errors import GatewayError, TaskNotFound, UnsupportedOperation
from gateway.inbound.call import deadline_from
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.pipeline import InFlight, peer_id_from_cert
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.messages import FollowUp, invoke_call
from gateway.server.a2a.request_checks import protocol_version, safe_id, speaks_1_0
from gateway.server.a2a.task_events import BackgroundTask
from gateway.server.a2a.task_store.store import A2ATask, A2ATaskStore
from gateway.server.received import edge_slot, peer_cert

TASK_NOT_FOUND = "task not found"
FINISHED = "the task has finished; it takes no more messages"
NOT_WAITING = "the task is working and does not wait for input"
WAITS_ELSEWHERE = (
    "the task waits for input in another process of this agent; a follow-up is taken only "
    "by the process running it"
)
TAKEN = "the task no longer waits for this input (another message answered it, or it ended)"

AdmitPeer = Callable[[Any, "aio.ServicerContext[Any, Any]", str], Awaitable[str]]
"""The servicer's Describe prefix with its A2A checks; returns the caller's SPIFFE ID."""


def continues_task(request: object) -> bool:
    """True for a SendMessage whose message names a task (a follow-up)."""
    return isinstance(request, a2a_pb2.SendMessageRequest) and bool(request.message.task_id)


class FollowUps:
    """Admits follow-up messages and hands them to the runs waiting for them.

    Args:
        handler: The decision path and audit.
        tasks: The task store (whose tasks are whose).
        runs: The runs of this process.
        admit_peer: The servicer's Describe prefix (for a refusal that names no
            capability: the caller is identified and limited, then refused).
    """

    def __init__(
        self,
        handler: InvokeHandler,
        tasks: A2ATaskStore,
        runs: BackgroundTasks,
        admit_peer: AdmitPeer,
    ) -> None:
        self._handler = handler
        self._tasks = tasks
        self._runs = runs
        self._admit_peer = admit_peer

    async def accept(
        self,
        request: a2a_pb2.SendMessageRequest,
        context: aio.ServicerContext[Any, Any],
        operation: str,
    ) -> BackgroundTask:
        """Admit the follow-up ``request`` and hand it to its task's run (now ``WORKING``).

        Returns the run, with no await since the hand-over: a ``listen()`` or
        ``next_settled()`` right after sees every event that follows.

        Raises:
            GatewayError: the refusal (audited once), the task left as it was.
        """
        task_id = request.message.task_id
        run = self._runs.running(task_id)
        question = None if run is None else run.waiting
        if run is None or question is None or _caller(context) != run.task.owner:
            raise await self._refusal(request, context, operation, run)
        if not speaks_1_0(protocol_version(context)):
            raise await self._refusal(request, context, operation, run)  # refused by the prefix
        follow_up = FollowUp(
            run.task.capability,
            run.task.served_version,
            run.task.context_id,
            question.schema if question.schema is not None else AnyObject,
        )
        call = invoke_call(
            request,
            peer_cert_pem=peer_cert(context),
            deadline=deadline_from(context.time_remaining(), 0),
            task_id=task_id,
            follow_up=follow_up,
        )
        admitted = await self._handler.admit(
            call, edge_slot=edge_slot(context), in_flight=InFlight.POLL
        )
        if not run.claim(question):
            refusal = UnsupportedOperation(TAKEN)
            await self._handler.settle_follow_up(admitted, refusal)
            raise refusal
        await self._handler.settle_follow_up(admitted, None)
        run.answer(question, admitted)
        return run

    async def _refusal(
        self,
        request: a2a_pb2.SendMessageRequest,
        context: aio.ServicerContext[Any, Any],
        operation: str,
        run: BackgroundTask | None,
    ) -> GatewayError:
        """Why the follow-up is refused, audited: after the Describe prefix (which refuses
        an unidentified, unknown, expired or limited caller itself), its task's answer."""
        peer_id = await self._admit_peer(request, context, operation)
        task_id = request.message.task_id
        stored: A2ATask | None
        if run is not None and run.task.owner == peer_id:
            stored = run.task
        else:  # one query names owner and id: another's task is the same empty answer
            try:
                stored = await self._tasks.get(peer_id, task_id)
            except GatewayError as err:
                return await self._handler.refuse(peer_id, err, f"A2A {operation}")
        error: GatewayError
        if stored is None:
            error = TaskNotFound(TASK_NOT_FOUND)
        elif stored.state.finished:
            error = UnsupportedOperation(FINISHED)
        elif stored.state.waiting and run is None:
            error = UnsupportedOperation(WAITS_ELSEWHERE)
        else:
            error = UnsupportedOperation(NOT_WAITING)
        return await self._handler.refuse(peer_id, error, f"A2A {operation}", safe_id(task_id))


def _caller(context: aio.ServicerContext[Any, Any]) -> str | None:
    """The caller's SPIFFE ID if its certificate names one (else None: the decision path
    refuses it, audited); read only to find its run, never to admit it."""
    try:
        return peer_id_from_cert(peer_cert(context))
    except GatewayError:
        return None
