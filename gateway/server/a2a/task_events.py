"""A background task's live state and events, and the streams that follow it.

:class:`BackgroundTask` is one run's latest state (``task``) and its listeners;
:class:`RunEvents` is what the capability's ``ctx.report_progress``,
``ctx.emit_chunk`` and ``ctx.ask_input`` reach; :class:`Listener` is one
stream's ordered queue. A listener gets the task as it is when it starts
listening, then every event in order; after the terminal one (or once it
falls ``MAX_BEHIND`` events behind: then the task as it is at that moment) its
stream ends; a SendStreamingMessage's listener ends at an interrupted state
too (the task waits for the caller's next message), a subscription's does not.

A *quiet* run (a capability that may answer with a Message) announces that it
works only when the capability first does something (a progress report, a
chunk, a question, its end): a stream can then still answer with the one
Message a capability replied before anything else. Everything here runs on
the event loop: no locks.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from a2a.types import a2a_pb2
from pydantic import BaseModel

from capabilities.canonical import canonical_json
from capabilities.context import MAX_PROGRESS_CHARS, AskState
from capabilities.contract import Risk
from capabilities.parts import Answer, Part, TextPart
from gateway.errors import GatewayError, OutputChunksTooLarge
from gateway.inbound.invoke_handler import AdmittedCall
from gateway.server.a2a import history
from gateway.server.a2a.schema_names import name_of
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome
from gateway.server.a2a.task_view import (
    WAITING_WIRE_STATES,
    fill_artifacts,
    task_event,
    task_message,
)
from gateway.server.a2a.wire_parts import JSON_MEDIA_TYPE, parts_json, set_json

MAX_BEHIND = 1024
"""Events a listener may have waiting before it is let go."""
"""A progress text longer than this is cut (it travels in every listener's queue)."""


class Listener:
    """One stream's queue of a run's events, in order.

    ``until_waiting``: the stream also ends after a status update into an
    interrupted state (SendStreamingMessage; a subscription follows the task
    to its end).
    """

    def __init__(self, run: BackgroundTask, *, until_waiting: bool = False) -> None:
        self.run = run
        self._events: deque[a2a_pb2.StreamResponse] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._until_waiting = until_waiting

    def push(self, event: a2a_pb2.StreamResponse, *, last: bool = False) -> None:
        """Queue ``event``; after ``last`` (or falling behind) the stream ends."""
        if self._closed:
            return
        if len(self._events) >= MAX_BEHIND:  # let go: the task as it is now, then the end
            self._events.append(task_event(self.run.task))
            last = True
        else:
            self._events.append(event)
            last = last or (self._until_waiting and _interrupts(event))
        self._closed = last
        self._wake.set()

    async def events(self) -> AsyncIterator[a2a_pb2.StreamResponse]:
        """The queued events as they come; ends after the last one."""
        try:
            while True:
                while self._events:
                    yield self._events.popleft()
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
        finally:
            self.run.listeners.discard(self)


@dataclass(eq=False)
class BackgroundTask:
    """One background task: its latest state, the job running it, who listens.

    Attributes:
        task: The task as it is now (progress text in ``message`` while running).
        admitted: The call the pipeline admitted (it holds the in-flight slot).
        listeners: Streams following the run.
        ended: Set once the task has ended and its end was published.
        stop: Why the job was cancelled (None: it was not).
        job: The asyncio task running the call.
        started: The job has taken its first step (a cancel now reaches the call).
        chunk_bytes: Bytes of output chunks sent so far (capped like the output).
        progressed: Called after each progress text (the runner saves it to the
            task's row, for followers in other processes).
        saving: A save of this run's row is under way (the runner's, one at a time).
        save_wanted: ``task`` changed while it was: save it again after.
        keeps_chunks: Other processes share the task store: output chunks are kept
            there too, for their followers.
        unsaved_chunks: Chunks (canonical JSON) emitted and not yet kept.
        chunks_kept: How many chunks are kept (the next one's number).
        changed: Called with the task's new state (the runner publishes and saves it).
        waiting: The question the capability waits on an answer to (``ctx.ask_input``).
        save_now: Set when a change must be saved without the usual pause (a question).
        unannounced: A quiet run whose WORKING state is not published yet.
        settles: Waiters for the next interrupted or terminal state (blocking sends).
        message_only: The run ended with a Message nobody saw a task before: the
            answer is that Message, and no task is kept.
        notify: Called with (owner, task id, event) for every event published
            (the push notifier's hook; None: push is off).
    """

    task: A2ATask
    admitted: AdmittedCall
    listeners: set[Listener] = field(default_factory=set)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    stop: GatewayError | None = None
    job: asyncio.Task[None] | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)
    chunk_bytes: int = 0
    progressed: Callable[[], None] | None = None
    saving: bool = False
    save_wanted: bool = False
    keeps_chunks: bool = False
    unsaved_chunks: list[bytes] = field(default_factory=list)
    chunks_kept: int = 0
    changed: Callable[[A2ATask], None] | None = None
    waiting: Question | None = None
    save_now: asyncio.Event = field(default_factory=asyncio.Event)
    unannounced: bool = False
    settles: list[asyncio.Future[A2ATask]] = field(default_factory=list)
    message_only: bool = False
    notify: Callable[[str, str, a2a_pb2.StreamResponse], None] | None = None

    @property
    def contract_asks(self) -> bool:
        """The capability may ask for input (its task keeps a history)."""
        return self.admitted.admission.capability.contract.asks_input

    @property
    def writes(self) -> bool:
        """The capability may have side effects (risk above ``read``)."""
        return self.admitted.admission.capability.contract.risk is not Risk.READ

    def publish(self, event: a2a_pb2.StreamResponse, *, last: bool = False) -> None:
        """Hand ``event`` to every listener (and to the push notifier)."""
        if self.notify is not None:
            self.notify(self.task.owner, self.task.task_id, event)
        for listener in list(self.listeners):
            listener.push(event, last=last)

    def listen(self, *, until_waiting: bool = False) -> Listener:
        """A new listener, whose first event is the task as it is now."""
        listener = Listener(self, until_waiting=until_waiting)
        ended = self.ended.is_set()
        listener.push(task_event(self.task), last=ended)
        if not ended:
            self.listeners.add(listener)
        return listener

    def announce(self) -> None:
        """Publish a quiet run's WORKING state, before anything else it publishes."""
        if self.unannounced:
            self.unannounced = False
            self.publish(status_event(self.task))

    def next_settled(self) -> asyncio.Future[A2ATask]:
        """The task at its next interrupted or terminal state (a blocking SendMessage's answer)."""
        settled: asyncio.Future[A2ATask] = asyncio.get_running_loop().create_future()
        if self.ended.is_set():
            settled.set_result(self.task)
        else:
            self.settles.append(settled)
        return settled

    def settle(self, task: A2ATask) -> None:
        """Hand ``task`` to every waiter of :meth:`next_settled`."""
        settles, self.settles = self.settles, []
        for settled in settles:
            if not settled.done():
                settled.set_result(task)

    def claim(self, question: Question) -> bool:
        """Take ``question`` for one follow-up (False: the run no longer waits on it, or
        another follow-up took it)."""
        if (
            self.waiting is not question
            or question.claimed
            or question.reply.done()
            or self.task.state.finished
        ):
            return False
        question.claimed = True
        return True

    def answer(
        self, question: Question, payload: BaseModel, message_id: str, parts: tuple[Part, ...]
    ) -> None:
        """Give the capability waiting on the claimed ``question`` its answer: the message
        ``message_id`` of ``parts``, whose content validated as ``payload`` (nothing if the
        capability stopped waiting meanwhile: cancelled, timed out)."""
        if self.waiting is not question or question.reply.done() or self.task.state.finished:
            return
        kept = self.task.history
        if self.contract_asks:
            kept = history.appended(kept, "user", message_id, parts_json(parts))
        self.waiting = None
        if self.changed is not None:
            self.changed(
                replace(
                    self.task,
                    state=TaskOutcome.WORKING,
                    message="",
                    status_json=b"",
                    history=kept,
                    asked_schema="",
                    updated_ms=int(time.time() * 1000),
                )
            )
        answer = payload if question.schema is not None else Answer(message_id, parts)
        question.reply.set_result(answer)


@dataclass(eq=False)
class Question:
    """What a capability waits on (``ctx.ask_input``): its schema and the answer to come.

    Attributes:
        schema: The model the answer is validated against (None: the whole message).
        reply: Resolved with the validated answer.
        claimed: A follow-up took it (it is being audited, then handed over).
    """

    schema: type[BaseModel] | None
    reply: asyncio.Future[Any]
    claimed: bool = False


def _interrupts(event: a2a_pb2.StreamResponse) -> bool:
    return event.HasField("status_update") and event.status_update.status.state in (
        WAITING_WIRE_STATES
    )


class RunEvents:
    """What ``ctx.report_progress`` and ``ctx.emit_chunk`` reach for one run."""

    def __init__(self, run: BackgroundTask) -> None:
        self._run = run

    async def progress(self, text: str) -> None:
        run = self._run
        run.announce()
        run.task = replace(run.task, message=str(text)[:MAX_PROGRESS_CHARS])
        run.publish(status_event(run.task))
        if run.progressed is not None:
            run.progressed()

    async def ask(
        self, prompt: tuple[Part, ...], state: AskState, schema: type[BaseModel] | None
    ) -> Any:
        run = self._run
        if not run.contract_asks:
            raise RuntimeError(
                "ctx.ask_input: the capability's contract does not declare asks_input=True"
            )
        run.announce()
        prompt_json = parts_json(prompt)
        message_id = str(uuid.uuid4())
        text = "\n".join(part.text for part in prompt if isinstance(part, TextPart))
        question = Question(schema, asyncio.get_running_loop().create_future())
        run.waiting = question
        if run.changed is not None:
            run.changed(
                replace(
                    run.task,
                    state=TaskOutcome(state),
                    message=text[:MAX_PROGRESS_CHARS],
                    status_json=canonical_json({"message_id": message_id, "parts": prompt_json}),
                    history=history.appended(run.task.history, "agent", message_id, prompt_json),
                    asked_schema=name_of(schema),
                    updated_ms=int(time.time() * 1000),
                )
            )
        try:
            return await question.reply
        finally:
            if run.waiting is question:
                run.waiting = None

    async def chunk(self, data: dict[str, Any] | str) -> None:
        run = self._run
        if not isinstance(data, dict | str):
            raise TypeError("an output chunk is a JSON object or a text")
        run.announce()
        encoded = canonical_json(data, allow_nan=False)
        cap = run.admitted.admission.grant.max_payload_bytes
        if run.chunk_bytes + len(encoded) > cap:
            raise OutputChunksTooLarge(f"output chunks exceed this peer's cap of {cap} bytes")
        first = run.chunk_bytes == 0
        run.chunk_bytes += len(encoded)
        run.publish(chunk_event(run.task, data, first=first))
        if run.keeps_chunks:
            run.unsaved_chunks.append(encoded)
            if run.progressed is not None:
                run.progressed()


def chunk_event(task: A2ATask, data: Any, *, first: bool) -> a2a_pb2.StreamResponse:
    """The artifact update carrying one output chunk of ``task`` (``append`` after the first):
    a text part for a text chunk, else a data part."""
    event = a2a_pb2.StreamResponse()
    update = event.artifact_update  # built in place: a built artifact would be merged in
    update.task_id, update.context_id = task.task_id, task.context_id
    update.append, update.last_chunk = not first, False
    update.artifact.artifact_id, update.artifact.name = f"{task.task_id}-chunks", "chunks"
    if isinstance(data, str):
        update.artifact.parts.add(text=data)
    else:
        set_json(update.artifact.parts.add(media_type=JSON_MEDIA_TYPE).data, data)
    return event


def status_event(task: A2ATask) -> a2a_pb2.StreamResponse:
    """The status update announcing ``task``'s state (and its message)."""
    status = task_message(task, include_artifacts=False).status
    return a2a_pb2.StreamResponse(
        status_update=a2a_pb2.TaskStatusUpdateEvent(
            task_id=task.task_id, context_id=task.context_id, status=status
        )
    )


def output_events(task: A2ATask) -> list[a2a_pb2.StreamResponse]:
    """The artifact updates carrying a completed ``task``'s artifacts (each ``last_chunk``;
    none for a Message answer)."""
    events: list[a2a_pb2.StreamResponse] = []

    def new_artifact() -> a2a_pb2.Artifact:
        event = a2a_pb2.StreamResponse()
        update = event.artifact_update
        update.task_id, update.context_id, update.last_chunk = task.task_id, task.context_id, True
        events.append(event)
        return update.artifact  # written in place: a built artifact would be merged in (slow)

    fill_artifacts(task, new_artifact)
    return events
