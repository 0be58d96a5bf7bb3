"""Messages that continue a task: the caller's answers to ``ctx.ask_input``.

A SendMessage (or SendStreamingMessage) whose message names a ``task_id``
continues that task, and only:

* the task's owner may (another peer's task id, or one that never existed,
  is ``TASK_NOT_FOUND``: the same answer, code path and audit record), acting
  for the same user as the message that started it (a verified
  ``A2AGW-User-Token``'s subject and issuer), or for none if it had none:
  another user of the same caller is ``TASK_NOT_FOUND`` too, once admitted;
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

With workers or replicas a follow-up may reach another process than the one
the task waits in. That process admits it the same way (the schema found by
the name the task's row keeps: ``schema_names``), leaves it in the store and
waits up to ``INPUT_WAIT_SECONDS`` for the running process to take it
(``left_answers``, which audits it then) or refuse it (audited here, as
``UNSUPPORTED_OPERATION``); the follow-up's answer then follows the task
through the store. Finding the task's row costs one indexed read by owner
and id before the decision order, for a message naming a task this process
does not run; a schema no other process can name (``?``) is
``UNSUPPORTED_OPERATION`` there, and the task keeps waiting. The row keeps
the user the task was started for (subject and issuer), so that process
compares the follow-up's user with it once admitted, as the running process
would (another user: ``TASK_NOT_FOUND``, audited there), before it leaves the
answer; a row that names no user it may have had (written by an older
gateway still running) matches no user at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from a2a.types import a2a_pb2
from grpc import aio
from pydantic import BaseModel

from capabilities.canonical import canonical_json
from capabilities.parts import AnyObject
from gateway.errors import DeadlineExceeded, GatewayError, TaskNotFound, UnsupportedOperation
from gateway.inbound.call import deadline_from
from gateway.inbound.invoke_handler import AdmittedCall, InvokeHandler, acting_user
from gateway.inbound.pipeline import InFlight, peer_id_from_cert
from gateway.server.a2a.background_tasks import BackgroundTasks
from gateway.server.a2a.messages import FollowUp, invoke_call
from gateway.server.a2a.request_checks import protocol_version, safe_id, speaks_1_0
from gateway.server.a2a.schema_names import UNNAMED, model_named
from gateway.server.a2a.task_events import BackgroundTask
from gateway.server.a2a.task_follow import TIMED_OUT
from gateway.server.a2a.task_store.inputs import PENDING, TAKEN, WITHDRAWN
from gateway.server.a2a.task_store.store import A2ATask, A2ATaskStore, TaskUser
from gateway.server.a2a.wire_parts import parts_json
from gateway.server.received import edge_slot, peer_cert, request_tokens

TASK_NOT_FOUND = "task not found"
FINISHED = "the task has finished; it takes no more messages"
NOT_WAITING = "the task is working and does not wait for input"
WAITS_ELSEWHERE = (
    "the task waits in another process of this agent for an answer only that process can "
    "check (its schema has no name other processes know); send it there"
)
NOT_TAKEN = "the task no longer waits for this input (another message answered it, or it ended)"
NOT_TAKEN_IN_TIME = "the process running the task did not take this input in time; it still waits"
INPUT_WAIT_SECONDS = 10.0
"""How long a follow-up left for another process waits for it to be taken."""

AdmitPeer = Callable[[Any, "aio.ServicerContext[Any, Any]", str], Awaitable[tuple[str, TaskUser]]]
"""The servicer's Describe prefix with its A2A checks; returns the caller's SPIFFE ID and
the user it acts for."""


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """A follow-up the process running its task took: the task as it was when it asked.

    Attributes:
        asked: The task's row when the follow-up was admitted (its question's
            status message tells that question from the next one).
    """

    asked: A2ATask


Continued = BackgroundTask | Elsewhere
"""What a follow-up continued: a run of this process, or a task another process runs."""


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
    ) -> Continued:
        """Admit the follow-up ``request`` and hand it to its task's run (now ``WORKING``).

        Returns the run, with no await since the hand-over (a ``listen()`` or
        ``next_settled()`` right after sees every event that follows), or, for
        a task another process runs, :class:`Elsewhere` once that process took it.

        Raises:
            GatewayError: the refusal (audited once), the task left as it was.
        """
        task_id = request.message.task_id
        run = self._runs.running(task_id)
        if run is None and self._runs.shared and speaks_1_0(protocol_version(context)):
            asked = await self._waiting_elsewhere(context, task_id)
            if asked is not None:
                return await self._leave(request, context, asked)
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
            tokens=request_tokens(context),
        )
        admitted = await self._handler.admit(
            call, edge_slot=edge_slot(context), in_flight=InFlight.POLL
        )
        if acting_user(admitted.call) != run.task.user:
            not_theirs = TaskNotFound(TASK_NOT_FOUND)  # another user's task: as another peer's
            await self._handler.settle_follow_up(admitted, not_theirs)
            raise not_theirs
        if not run.claim(question):
            refusal = UnsupportedOperation(NOT_TAKEN)
            await self._handler.settle_follow_up(admitted, refusal)
            raise refusal
        await self._handler.settle_follow_up(admitted, None)
        parts = () if admitted.call.message is None else admitted.call.message.parts()
        run.answer(question, admitted.payload, admitted.call.request_id, parts)
        return run

    async def _waiting_elsewhere(
        self, context: aio.ServicerContext[Any, Any], task_id: str
    ) -> A2ATask | None:
        """The caller's task ``task_id`` if it waits with a schema this process can name
        (whichever user it was started for: the follow-up's is compared once admitted)."""
        caller = _caller(context)
        if caller is None:
            return None
        try:
            stored = await self._tasks.get(caller, task_id, user=None)
        except GatewayError:
            return None  # the refusal path reads again, and answers the error
        if stored is None or not stored.state.waiting or _schema(stored) is None:
            return None
        return stored

    async def _leave(
        self,
        request: a2a_pb2.SendMessageRequest,
        context: aio.ServicerContext[Any, Any],
        asked: A2ATask,
    ) -> Elsewhere:
        """Admit a follow-up to a task another process runs, leave it there, wait until taken."""
        schema = _schema(asked)
        assert schema is not None
        follow_up = FollowUp(asked.capability, asked.served_version, asked.context_id, schema)
        call = invoke_call(
            request,
            peer_cert_pem=peer_cert(context),
            deadline=deadline_from(context.time_remaining(), 0),
            task_id=asked.task_id,
            follow_up=follow_up,
            tokens=request_tokens(context),
        )
        admitted = await self._handler.admit(
            call, edge_slot=edge_slot(context), in_flight=InFlight.POLL
        )
        if acting_user(admitted.call) != asked.user:
            not_theirs = TaskNotFound(TASK_NOT_FOUND)  # another user's task: as another peer's
            await self._handler.settle_follow_up(admitted, not_theirs)
            raise not_theirs
        try:
            state = await self._left(asked, admitted)
        except BaseException:
            if admitted.slot is not None:
                admitted.slot.release()
            raise
        if state == TAKEN:  # audited by the process that took it
            if admitted.slot is not None:
                admitted.slot.release()
            return Elsewhere(asked)
        refusal = UnsupportedOperation(NOT_TAKEN_IN_TIME if state == WITHDRAWN else NOT_TAKEN)
        await self._handler.settle_follow_up(admitted, refusal)
        raise refusal

    async def _left(self, asked: A2ATask, admitted: AdmittedCall) -> str:
        """Leave ``admitted`` for the process running ``asked``; how it ended there."""
        call, owner, task_id = admitted.call, asked.owner, asked.task_id
        parts = canonical_json(parts_json(() if call.message is None else call.message.parts()))
        now_ms = int(time.time() * 1000)
        if not await self._tasks.leave_input(
            owner, task_id, call.request_id, call.payload, parts, now_ms
        ):
            return WITHDRAWN  # an answer with this id is there already (not this one)
        state: str | None = PENDING
        pause, waited = 0.02, 0.0
        while state == PENDING and waited < INPUT_WAIT_SECONDS:
            await asyncio.sleep(pause)
            waited += pause
            pause = min(pause * 2, 0.5)
            state = await self._tasks.input_state(owner, task_id, call.request_id)
        if state == PENDING and await self._tasks.end_input(task_id, call.request_id, WITHDRAWN):
            state = WITHDRAWN
        elif state == PENDING:  # decided between the last read and the withdrawal
            state = await self._tasks.input_state(owner, task_id, call.request_id)
        await self._tasks.forget_input(owner, task_id, call.request_id)
        return state or WITHDRAWN

    async def after(self, asked: A2ATask, deadline: float, *, settled: bool) -> A2ATask:
        """The task another process runs, once it no longer shows the question ``asked``
        showed (``settled``: once it is at its next question or its end).

        Raises:
            DeadlineExceeded: ``deadline`` (epoch seconds) passed first.
            TaskNotFound: the row is gone.
        """
        pause = 0.02
        while True:
            latest = await self._tasks.get(asked.owner, asked.task_id, asked.user)
            if latest is None:
                raise TaskNotFound(TASK_NOT_FOUND)
            moved = not (latest.state.waiting and latest.status_json == asked.status_json)
            if moved and (not settled or latest.state.finished or latest.state.waiting):
                return latest
            if time.time() >= deadline:
                raise DeadlineExceeded(TIMED_OUT)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _refusal(
        self,
        request: a2a_pb2.SendMessageRequest,
        context: aio.ServicerContext[Any, Any],
        operation: str,
        run: BackgroundTask | None,
    ) -> GatewayError:
        """Why the follow-up is refused, audited: after the Describe prefix (which refuses
        an unidentified, unknown, expired or limited caller itself), its task's answer."""
        peer_id, user = await self._admit_peer(request, context, operation)
        task_id = request.message.task_id
        stored: A2ATask | None
        if run is not None and (run.task.owner, run.task.user) == (peer_id, user):
            stored = run.task
        else:  # one query names owner, user and id: another's task is the same empty answer
            try:
                stored = await self._tasks.get(peer_id, task_id, user)
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


def _schema(task: A2ATask) -> type[BaseModel] | None:
    """The model an answer to ``task``'s question is validated against, if this process can
    name it (``AnyObject`` for a question asked without one)."""
    if task.asked_schema == UNNAMED:
        return None
    return AnyObject if not task.asked_schema else model_named(task.asked_schema)


def _caller(context: aio.ServicerContext[Any, Any]) -> str | None:
    """The caller's SPIFFE ID, read only to find its task, never to admit it: its
    certificate's (a token a certificate holder presents is bound to it), or, for a
    token-only caller, what the HTTP edge's check of its tokens found. None: unknown
    here (the decision path identifies, or refuses, it, audited)."""
    pem = peer_cert(context)
    if pem:
        try:
            return peer_id_from_cert(pem)
        except GatewayError:
            return None
    tokens = request_tokens(context)
    verified = None if tokens is None else tokens.verified
    return None if verified is None else verified.peer_id
