"""Following a long-running task of an upstream A2A agent until it ends or waits.

A fronted skill is sent with ``return_immediately``, so no call to the
upstream is held open for the whole work: an answer that is a message, a
finished task or one waiting for its caller (``INPUT_REQUIRED``,
``AUTH_REQUIRED``) is used at once; a task still ``SUBMITTED``/``WORKING`` is
polled with ``GetTask`` (10 ms, doubling to 1 s between polls) until it ends
or waits. Its status texts are passed on as the capability's progress (cut by
the caller's sink). A message that continues an upstream task must be
answered about that task (another task id is ``UnreadableAnswer``). When the
capability gives up on the upstream task (cancelled by the caller's
``CancelTask``, its timeout or shutdown; failed while following it; or it
cannot pass a question on) the upstream task is cancelled too
(:class:`Abandon`, once per task): ``CancelTask``, best effort, sent in the
background (``UpstreamCancels``), each bounded by ``CANCEL_SECONDS``; closing
the connection waits for those in flight. A capability that timed out or
failed answers at once, whatever the upstream does with the cancel; one that
is itself cancelled waits for it while its own time lasts (its caller's
CancelTask is answered once the upstream has been told, if it answers in time).

With ``[[upstreams]] streaming = true`` and a caller that follows its task,
the skill is sent with ``SendStreamingMessage`` instead (:func:`streamed`):
status texts become progress, intermediate artifact updates (``last_chunk``
false) become output chunks (each a JSON object: a ``data`` object as it is,
a text part as ``{"text": ...}``, capped by the caller's sink), and the
artifacts collected by the end (``append`` honoured; kept across the streams
of one conversation, :class:`StreamedTask`) are the answer, checked against
the output contract like any other. A text chunk is passed on as text for a
skill that gives parts as they are (``text_chunks``). Collected parts are
counted per artifact as they arrive (a ``task`` event replaces an artifact's
parts, an artifact update appends to or replaces them): once the total passes
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
from collections.abc import Awaitable, Callable

from a2a.client import Client, ClientCallContext
from a2a.types import (
    Artifact,
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
"""Parked upstream, waiting for its caller: the answer, for the capability to pass on."""
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


class Abandon:
    """How one call (one conversation with an upstream task) gives up on that task.

    Each task is cancelled at most once, whoever gives up on it first.

    Attributes:
        cancels: Where the ``CancelTask`` runs, in the background.
        until: Loop time at which the call's own time (its capability's timeout) ends.
    """

    __slots__ = ("_cancelled", "cancels", "until")

    def __init__(self, cancels: UpstreamCancels, until: float) -> None:
        self.cancels = cancels
        self.until = until
        self._cancelled: set[str] = set()

    def start(self, client: Client, task_id: str) -> asyncio.Task[None] | None:
        """Send ``CancelTask`` for ``task_id`` in the background (None: already sent)."""
        if not task_id or task_id in self._cancelled:
            return None
        self._cancelled.add(task_id)
        return self.cancels.start(client, task_id)

    async def task(self, client: Client, task_id: str, ended_by: BaseException) -> None:
        """Cancel ``task_id`` upstream, the call being left by ``ended_by``.

        Waited for only when the call itself is cancelled, and only while its
        time lasts: a call that timed out has none left, and CAPABILITY_TIMEOUT
        must not wait for an upstream that never answers ``CancelTask``.
        """
        running = self.start(client, task_id)
        left = min(self.until - asyncio.get_running_loop().time(), CANCEL_SECONDS)
        if running is not None and isinstance(ended_by, asyncio.CancelledError) and left > 0:
            await asyncio.wait({running}, timeout=left)  # the cancel goes on if this is cut


async def followed(
    client: Client,
    first: StreamResponse,
    progress: Progress | None,
    call_timeout: float,
    abandon: Abandon,
    continues: str = "",
) -> StreamResponse:
    """``first``, or once it is a running task, that task as it ended or waits.

    ``call_timeout`` bounds each poll (the capability's own timeout bounds the
    whole). ``continues``: the upstream task the message continued (its answer
    must be about it). Left by an exception (cancelled included), the task is
    cancelled upstream (``abandon``).

    Raises:
        UnreadableAnswer: an answer about another task than the one asked about.
    """
    if first.WhichOneof("payload") != "task":
        return first
    if continues and first.task.id != continues:
        raise UnreadableAnswer("the upstream answered a follow-up with another task")
    if first.task.status.state not in _RUNNING:
        _given_up_unless_settled(client, first.task, abandon)
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
    _given_up_unless_settled(client, task, abandon)
    return _task_event(task)


def _given_up_unless_settled(client: Client, task: Task, abandon: Abandon) -> None:
    """Cancel ``task`` upstream (in the background) unless it ended or waits for its
    caller: a stream ended while it ran, or its state is none A2A knows; this call
    leaves it (and fails)."""
    if task.id and task.status.state not in _STOPS:
        abandon.start(client, task.id)


async def _passed_on(task: Task, said: str, progress: Progress | None) -> str:
    text = "".join(part.text for part in task.status.message.parts if part.HasField("text"))
    if progress is not None and text and text != said:
        await progress(text)
    return text


async def _cancel_upstream(client: Client, task_id: str) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CANCEL_SECONDS):
            await client.cancel_task(
                CancelTaskRequest(id=task_id), context=ClientCallContext(timeout=CANCEL_SECONDS)
            )
        return
    _log.warning("upstream task could not be cancelled (it may run to its end)")


class StreamedTask:
    """What the streams of one conversation with an upstream task have told so far.

    Attributes:
        task: The task as its events left it (its artifacts held in ``collected``).
        collected: Its artifacts, collected and counted.
    """

    __slots__ = ("collected", "task")

    def __init__(self) -> None:
        self.task = Task()
        self.collected = _Collected()


async def streamed(
    client: Client,
    request: SendMessageRequest,
    events: CallEvents,
    context: ClientCallContext,
    abandon: Abandon,
    *,
    seen: StreamedTask | None = None,
    text_chunks: bool = False,
) -> StreamResponse:
    """Stream ``request`` from the upstream, passing events on; the answer as a task event.

    Returns the upstream's message, or a task holding the collected artifacts
    and the last state (a task that did not complete or wait is for the caller
    to refuse). ``seen``: what earlier streams of the conversation told (a
    message continuing its task must be answered about that task). Left by an
    exception (cancelled included) before the task ended, the task is
    cancelled upstream (``abandon``); the stream itself is cancelled however
    it is left.

    Raises:
        UnreadableAnswer: the collected parts exceed ``MESSAGE_CEILING``, a
            chunk holds a number JSON cannot carry, or an event is about
            another task.
    """
    seen = seen if seen is not None else StreamedTask()
    task = seen.task
    if task.id:  # continued: it works on the answer until its events say otherwise
        task.status.state = TaskState.TASK_STATE_WORKING
    try:
        with cancelled_on_exit():
            async for event in client.send_message(request, context=context):
                if event.WhichOneof("payload") == "message":
                    return event
                await _take(event, seen, events, text_chunks)
                if task.status.state in _STOPS:
                    break
    except BaseException as err:
        if task.id and task.status.state not in _ENDED:
            await abandon.task(client, task.id, err)
        raise
    _given_up_unless_settled(client, task, abandon)
    answer = _task_event(task)
    seen.collected.fill(answer.task)
    return answer


async def _take(
    event: StreamResponse, seen: StreamedTask, events: CallEvents, text_chunks: bool
) -> None:
    """Fold one stream event (not a message) into ``seen``; pass it on."""
    task, collected = seen.task, seen.collected
    kind = event.WhichOneof("payload")
    about = event.task.id if kind == "task" else getattr(event, kind).task_id if kind else ""
    if task.id and about and about != task.id:
        raise UnreadableAnswer("an event of the upstream's stream is about another task")
    if kind == "task":
        task.CopyFrom(event.task)
        del task.artifacts[:]  # held (and counted) in collected only
        for artifact in event.task.artifacts:
            collected.put(artifact, append=False)
    elif kind == "status_update":
        task.status.CopyFrom(event.status_update.status)
        await _passed_on(task, "", events.progress)
    elif kind == "artifact_update":
        update = event.artifact_update
        collected.put(update.artifact, append=update.append)
        if not update.last_chunk:
            for part in update.artifact.parts:
                await _chunk(part, events, text_chunks)


class _Collected:
    """The artifacts collected from a stream, by artifact id, with their total size."""

    __slots__ = ("_artifacts", "_sizes", "_total")

    def __init__(self) -> None:
        self._artifacts: dict[str, Artifact] = {}
        self._sizes: dict[str, int] = {}
        self._total = 0

    def put(self, artifact: Artifact, *, append: bool) -> None:
        """Append ``artifact``'s parts to the collected one of its id, or replace it.

        Raises:
            UnreadableAnswer: all collected parts would then exceed ``MESSAGE_CEILING``.
        """
        key = artifact.artifact_id
        size = sum(part.ByteSize() for part in artifact.parts)
        before = self._sizes.get(key, 0)
        after = before + size if append else size
        if self._total - before + after > MESSAGE_CEILING:
            raise UnreadableAnswer("the upstream's artifacts exceed the size limit")
        kept = self._artifacts.get(key)
        if kept is None or not append:
            kept = self._artifacts[key] = Artifact(artifact_id=key)
        for name in ("name", "description"):
            if getattr(artifact, name):
                setattr(kept, name, getattr(artifact, name))
        for part in artifact.parts:
            kept.parts.add().CopyFrom(part)  # parts=[...] or extend would merge each part: slow
        self._sizes[key] = after
        self._total += after - before

    def fill(self, task: Task) -> None:
        """Give ``task`` every collected artifact, in the order they first came."""
        for artifact in self._artifacts.values():
            task.artifacts.add().CopyFrom(artifact)


async def _chunk(part: Part, events: CallEvents, text_chunks: bool) -> None:
    if part.HasField("data") and part.data.WhichOneof("kind") == "struct_value":
        try:
            chunk = plain_json(part.data)
        except ValueError as err:  # NaN or infinity: the caller could not be sent it as JSON
            raise UnreadableAnswer("a chunk of the upstream's stream is not JSON") from err
        await events.chunk(chunk)
    elif part.HasField("text"):
        await events.chunk(part.text if text_chunks else {"text": part.text})


def _task_event(task: Task) -> StreamResponse:
    """``task`` as a stream event, copied in (``StreamResponse(task=...)`` merges: slow)."""
    event = StreamResponse()
    event.task.CopyFrom(task)
    return event
