"""Following a long-running task of an upstream A2A agent to its end.

A fronted skill is sent with ``return_immediately``, so no call to the
upstream is held open for the whole work: an answer that is a message or a
finished task is used at once; a task still ``SUBMITTED``/``WORKING`` is
polled with ``GetTask`` (10 ms, doubling to 1 s between polls) until it
ends. Its status texts are passed on as the capability's progress (cut by
the caller's sink). When the capability gives up on the upstream task
(cancelled by the caller's ``CancelTask``, its timeout or shutdown; or failed
while following it) the upstream task is cancelled too (:class:`Abandon`):
``CancelTask``, best effort, sent in the background (``UpstreamCancels``),
each bounded by ``CANCEL_SECONDS``; closing the connection waits for those in
flight. A capability that timed out or failed answers at once, whatever the
upstream does with the cancel; one that is itself cancelled waits for it
while its own time lasts (its caller's CancelTask is answered once the
upstream has been told, if it answers in time).

With ``[[upstreams]] streaming = true`` and a caller that follows its task,
the skill is sent with ``SendStreamingMessage`` instead (:func:`streamed`):
status texts become progress, intermediate artifact updates (``last_chunk``
false) become output chunks (each a JSON object: a ``data`` object as it is,
a text part as ``{"text": ...}``, capped by the caller's sink), and the
artifacts collected by the end (``append`` honoured) are the answer, checked
against the output contract like any other. Collected parts are counted per
artifact as they arrive (a ``task`` event replaces an artifact's parts, an
artifact update appends to or replaces them): once the total passes
``MESSAGE_CEILING`` bytes, or a chunk holds a number JSON cannot carry, there
is no readable answer (``UnreadableAnswer``: INVALID_OUTPUT). A chunk over the
caller's cap fails the call as for a local capability (``OutputTooLarge``
passes through). Either way, the upstream task is cancelled, and the gRPC
stream is cancelled as soon as it is no longer read (``upstream_streams``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from a2a.client import Client, ClientCallContext
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Part,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)

from capabilities.context import CallEvents
from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_streams import cancelled_on_exit
from gateway.transport.a2a.part_payloads import plain_json
from gateway.transport.tls import MESSAGE_CEILING

_log = logging.getLogger(__name__)

FIRST_POLL_SECONDS = 0.01
MAX_POLL_SECONDS = 1.0
CANCEL_SECONDS = 2.0
_RUNNING = frozenset({TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING})
_ENDED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
_INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
"""Parked upstream, waiting for more input: this call never sends any, so it gives up."""
_STOPS = _ENDED | _INTERRUPTED

Progress = Callable[[str], Awaitable[None]]
"""Where an upstream task's status texts go (``ctx.report_progress``)."""


class UpstreamCancels:
    """The upstream tasks being cancelled in the background, held until each ends.

    A capability that gives up on an upstream task must answer now (its
    timeout is CAPABILITY_TIMEOUT at the timeout, not after an upstream that
    never answers ``CancelTask``), so the cancel runs in a task of its own,
    referenced here so that it is not garbage collected midway.
    """

    def __init__(self) -> None:
        self._running: set[asyncio.Task[None]] = set()

    def start(self, client: Client, task_id: str) -> asyncio.Task[None]:
        """Send ``CancelTask`` for ``task_id`` in the background (at most ``CANCEL_SECONDS``)."""
        running = asyncio.get_running_loop().create_task(_cancel_upstream(client, task_id))
        self._running.add(running)
        running.add_done_callback(self._running.discard)
        return running

    async def wait(self) -> None:
        """Wait for the cancels in flight, at most ``CANCEL_SECONDS`` (each is bounded by it)."""
        if not self._running:
            return
        _, late = await asyncio.wait(set(self._running), timeout=CANCEL_SECONDS)
        for running in late:
            running.cancel()


@dataclass(frozen=True, slots=True)
class Abandon:
    """How one call gives up on its upstream task.

    Attributes:
        cancels: Where the ``CancelTask`` runs, in the background.
        until: Loop time at which the call's own time (its capability's timeout) ends.
    """

    cancels: UpstreamCancels
    until: float

    async def task(self, client: Client, task_id: str, ended_by: BaseException) -> None:
        """Cancel ``task_id`` upstream, the call being left by ``ended_by``.

        Waited for only when the call itself is cancelled, and only while its
        time lasts: a call that timed out has none left, and CAPABILITY_TIMEOUT
        must not wait for an upstream that never answers ``CancelTask``.
        """
        running = self.cancels.start(client, task_id)
        left = min(self.until - asyncio.get_running_loop().time(), CANCEL_SECONDS)
        if isinstance(ended_by, asyncio.CancelledError) and left > 0:
            await asyncio.wait({running}, timeout=left)  # the cancel goes on if this is cut


async def followed(
    client: Client,
    first: StreamResponse,
    progress: Progress | None,
    call_timeout: float,
    abandon: Abandon,
) -> StreamResponse:
    """``first``, or once it is a running task, that task as it ended.

    ``call_timeout`` bounds each poll (the capability's own timeout bounds the
    whole). Left by an exception (cancelled included), the task is cancelled
    upstream (``abandon``).
    """
    if first.WhichOneof("payload") != "task":
        return first
    if first.task.status.state not in _RUNNING:
        _given_up_unless_ended(client, first.task, abandon)
        return first
    task = first.task
    task_id = task.id  # every poll, and the cancel, are about this task only
    said = ""
    pause = FIRST_POLL_SECONDS
    try:
        while task.status.state in _RUNNING:
            said = await _passed_on(task, said, progress)
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_POLL_SECONDS)
            task = await client.get_task(
                GetTaskRequest(id=task_id), context=ClientCallContext(timeout=call_timeout)
            )
            if task.id != task_id:
                raise UnreadableAnswer("the upstream answered GetTask with another task")
    except BaseException as err:
        await abandon.task(client, task_id, err)
        raise
    _given_up_unless_ended(client, task, abandon)
    return _task_event(task)


def _given_up_unless_ended(client: Client, task: Task, abandon: Abandon) -> None:
    """Cancel ``task`` upstream (in the background) if it has not ended: it waits for
    input or authentication, or a stream ended while it ran; this call leaves it."""
    if task.id and task.status.state not in _ENDED:
        abandon.cancels.start(client, task.id)


async def _passed_on(task: Task, said: str, progress: Progress | None) -> str:
    text = "".join(part.text for part in task.status.message.parts if part.HasField("text"))
    if progress is not None and text and text != said:
        await progress(text)
    return text


async def _cancel_upstream(client: Client, task_id: str) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            client.cancel_task(
                CancelTaskRequest(id=task_id), context=ClientCallContext(timeout=CANCEL_SECONDS)
            ),
            CANCEL_SECONDS,
        )
        return
    _log.warning("upstream task could not be cancelled (it may run to its end)")


async def streamed(
    client: Client,
    request: SendMessageRequest,
    events: CallEvents,
    context: ClientCallContext,
    abandon: Abandon,
) -> StreamResponse:
    """Stream ``request`` from the upstream, passing events on; the answer as a task event.

    Returns the upstream's message, or a task holding the collected artifacts
    and the last state (a task that did not complete is for the caller to
    refuse). Left by an exception (cancelled included) before the task ended,
    the task is cancelled upstream (``abandon``); the stream itself is
    cancelled however it is left.

    Raises:
        UnreadableAnswer: the collected parts exceed ``MESSAGE_CEILING``, or a
            chunk holds a number JSON cannot carry.
    """
    task = Task()
    collected = _Collected()
    try:
        with cancelled_on_exit():
            async for event in client.send_message(request, context=context):
                if event.WhichOneof("payload") == "message":
                    return event
                await _take(event, task, collected, events)
                if task.status.state in _STOPS:
                    break
    except BaseException as err:
        if task.id and task.status.state not in _ENDED:
            await abandon.task(client, task.id, err)
        raise
    _given_up_unless_ended(client, task, abandon)
    answer = task.artifacts.add(artifact_id="answer")
    for part in collected.parts():
        answer.parts.add().CopyFrom(part)  # parts=[...] or extend would merge each part: slow
    return _task_event(task)


async def _take(
    event: StreamResponse, task: Task, collected: _Collected, events: CallEvents
) -> None:
    """Fold one stream event (not a message) into ``task`` and ``collected``; pass it on."""
    kind = event.WhichOneof("payload")
    about = event.task.id if kind == "task" else getattr(event, kind).task_id if kind else ""
    if task.id and about and about != task.id:
        raise UnreadableAnswer("an event of the upstream's stream is about another task")
    if kind == "task":
        task.CopyFrom(event.task)
        del task.artifacts[:]  # held (and counted) in collected only
        for artifact in event.task.artifacts:
            collected.put(artifact.artifact_id, artifact.parts, append=False)
    elif kind == "status_update":
        task.status.CopyFrom(event.status_update.status)
        await _passed_on(task, "", events.progress)
    elif kind == "artifact_update":
        update = event.artifact_update
        collected.put(update.artifact.artifact_id, update.artifact.parts, append=update.append)
        if not update.last_chunk:
            for part in update.artifact.parts:
                await _chunk(part, events)


class _Collected:
    """The artifacts' parts collected from a stream, by artifact id, with their total size."""

    __slots__ = ("_parts", "_sizes", "_total")

    def __init__(self) -> None:
        self._parts: dict[str, list[Part]] = {}
        self._sizes: dict[str, int] = {}
        self._total = 0

    def put(self, artifact_id: str, parts: Sequence[Part], *, append: bool) -> None:
        """Append ``parts`` to the artifact's, or replace them.

        Raises:
            UnreadableAnswer: all collected parts would then exceed ``MESSAGE_CEILING``.
        """
        size = sum(part.ByteSize() for part in parts)
        before = self._sizes.get(artifact_id, 0)
        after = before + size if append else size
        if self._total - before + after > MESSAGE_CEILING:
            raise UnreadableAnswer("the upstream's artifacts exceed the size limit")
        if append:
            self._parts.setdefault(artifact_id, []).extend(parts)
        else:
            self._parts[artifact_id] = list(parts)
        self._sizes[artifact_id] = after
        self._total += after - before

    def parts(self) -> Iterator[Part]:
        """Every artifact's parts, artifacts in the order they first came."""
        for parts in self._parts.values():
            yield from parts


async def _chunk(part: Part, events: CallEvents) -> None:
    if part.HasField("data") and part.data.WhichOneof("kind") == "struct_value":
        try:
            chunk = plain_json(part.data)
        except ValueError as err:  # NaN or infinity: the caller could not be sent it as JSON
            raise UnreadableAnswer("a chunk of the upstream's stream is not JSON") from err
        await events.chunk(chunk)
    elif part.HasField("text"):
        await events.chunk({"text": part.text})


def _task_event(task: Task) -> StreamResponse:
    """``task`` as a stream event, copied in (``StreamResponse(task=...)`` merges: slow)."""
    event = StreamResponse()
    event.task.CopyFrom(task)
    return event
