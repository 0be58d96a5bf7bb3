"""A background task's live state and events, and the streams that follow it.

:class:`BackgroundTask` is one run's latest state (``task``) and its listeners;
:class:`RunEvents` is what the capability's ``ctx.report_progress`` and
``ctx.emit_chunk`` reach; :class:`Listener` is one stream's ordered queue.
A listener gets the task as it is when it starts listening, then every
event in order; after the terminal one (or once it falls ``MAX_BEHIND``
events behind: then the task as it is at that moment) its stream ends.
Everything here runs on the event loop: no locks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format

from capabilities.canonical import canonical_json
from capabilities.contract import Risk
from gateway.errors import GatewayError, OutputChunksTooLarge
from gateway.inbound.invoke_handler import AdmittedCall
from gateway.server.a2a.messages import (
    JSON_MEDIA_TYPE,
    fill_artifact,
    task_event,
    task_message,
)
from gateway.server.a2a.task_store.store import A2ATask

MAX_BEHIND = 1024
"""Events a listener may have waiting before it is let go."""
MAX_PROGRESS_CHARS = 4096
"""A progress text longer than this is cut (it travels in every listener's queue)."""


class Listener:
    """One stream's queue of a run's events, in order."""

    def __init__(self, run: BackgroundTask) -> None:
        self.run = run
        self._events: deque[a2a_pb2.StreamResponse] = deque()
        self._wake = asyncio.Event()
        self._closed = False

    def push(self, event: a2a_pb2.StreamResponse, *, last: bool = False) -> None:
        """Queue ``event``; after ``last`` (or falling behind) the stream ends."""
        if self._closed:
            return
        if len(self._events) >= MAX_BEHIND:  # let go: the task as it is now, then the end
            self._events.append(task_event(self.run.task))
            last = True
        else:
            self._events.append(event)
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
    notify: Callable[[str, str, a2a_pb2.StreamResponse], None] | None = None

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

    def listen(self) -> Listener:
        """A new listener, whose first event is the task as it is now."""
        listener = Listener(self)
        ended = self.ended.is_set()
        listener.push(task_event(self.task), last=ended)
        if not ended:
            self.listeners.add(listener)
        return listener


class RunEvents:
    """What ``ctx.report_progress`` and ``ctx.emit_chunk`` reach for one run."""

    def __init__(self, run: BackgroundTask) -> None:
        self._run = run

    async def progress(self, text: str) -> None:
        run = self._run
        run.task = replace(run.task, message=str(text)[:MAX_PROGRESS_CHARS])
        run.publish(status_event(run.task))
        if run.progressed is not None:
            run.progressed()

    async def chunk(self, data: dict[str, Any]) -> None:
        run = self._run
        if not isinstance(data, dict):
            raise TypeError("an output chunk is a JSON object")
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


def chunk_event(task: A2ATask, data: dict[str, Any], *, first: bool) -> a2a_pb2.StreamResponse:
    """The artifact update carrying one output chunk of ``task`` (``append`` after the first)."""
    event = a2a_pb2.StreamResponse()
    update = event.artifact_update  # built in place: a built artifact would be merged in
    update.task_id, update.context_id = task.task_id, task.context_id
    update.append, update.last_chunk = not first, False
    update.artifact.artifact_id, update.artifact.name = f"{task.task_id}-chunks", "chunks"
    part = update.artifact.parts.add(media_type=JSON_MEDIA_TYPE)
    json_format.ParseDict(data, part.data)
    return event


def status_event(task: A2ATask) -> a2a_pb2.StreamResponse:
    """The status update announcing ``task``'s state (and its message)."""
    status = task_message(task, include_artifacts=False).status
    return a2a_pb2.StreamResponse(
        status_update=a2a_pb2.TaskStatusUpdateEvent(
            task_id=task.task_id, context_id=task.context_id, status=status
        )
    )


def output_event(task: A2ATask) -> a2a_pb2.StreamResponse:
    """The artifact update carrying a completed ``task``'s output (``last_chunk``)."""
    event = a2a_pb2.StreamResponse()
    update = event.artifact_update
    update.task_id, update.context_id, update.last_chunk = task.task_id, task.context_id, True
    fill_artifact(update.artifact, task)  # in place: a built artifact would be merged in (slow)
    return event
