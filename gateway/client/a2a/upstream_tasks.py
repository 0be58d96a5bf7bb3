"""Following a long-running task of an upstream A2A agent to its end.

A fronted skill is sent with ``return_immediately``, so no call to the
upstream is held open for the whole work: an answer that is a message or a
finished task is used at once; a task still ``SUBMITTED``/``WORKING`` is
polled with ``GetTask`` (10 ms, doubling to 1 s between polls) until it
ends. Its status texts are passed on as the capability's progress (cut by
the caller's sink). When the capability is cancelled (the caller's
``CancelTask``, its timeout, shutdown) the upstream task is cancelled too
(``CancelTask``, at most ``CANCEL_SECONDS``, best effort: the cancellation
goes on whatever it answers).

With ``[[upstreams]] streaming = true`` and a caller that follows its task,
the skill is sent with ``SendStreamingMessage`` instead (:func:`streamed`):
status texts become progress, intermediate artifact updates (``last_chunk``
false) become output chunks (each a JSON object: a ``data`` object as it is,
a text part as ``{"text": ...}``, capped by the caller's sink), and the
artifacts collected by the end (``append`` honoured) are the answer, checked
against the output contract like any other. More than ``MESSAGE_CEILING``
bytes of collected parts is no readable answer (INVALID_OUTPUT).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

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
from google.protobuf import json_format

from capabilities.context import CallEvents
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

Progress = Callable[[str], Awaitable[None]]
"""Where an upstream task's status texts go (``ctx.report_progress``)."""


async def followed(
    client: Client, first: StreamResponse, progress: Progress | None, call_timeout: float
) -> StreamResponse:
    """``first``, or once it is a running task, that task as it ended.

    ``call_timeout`` bounds each poll (the capability's own timeout bounds the whole).
    """
    if first.WhichOneof("payload") != "task" or first.task.status.state not in _RUNNING:
        return first
    task = first.task
    said = ""
    pause = FIRST_POLL_SECONDS
    try:
        while task.status.state in _RUNNING:
            said = await _passed_on(task, said, progress)
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_POLL_SECONDS)
            task = await client.get_task(
                GetTaskRequest(id=task.id), context=ClientCallContext(timeout=call_timeout)
            )
    except asyncio.CancelledError:
        await asyncio.shield(_cancel_upstream(client, task.id))
        raise
    return _task_event(task)


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
    client: Client, request: SendMessageRequest, events: CallEvents, context: ClientCallContext
) -> StreamResponse:
    """Stream ``request`` from the upstream, passing events on; the answer as a task event.

    Returns the upstream's message, or a task holding the collected artifacts
    and the last state (a task that did not complete is for the caller to
    refuse), or an empty event when the parts exceed ``MESSAGE_CEILING``.
    """
    task = Task()
    artifacts: dict[str, list[Part]] = {}
    size = 0
    try:
        async for event in client.send_message(request, context=context):
            kind = event.WhichOneof("payload")
            if kind == "message":
                return event
            if kind == "task":
                task.CopyFrom(event.task)
                for artifact in event.task.artifacts:
                    artifacts[artifact.artifact_id] = list(artifact.parts)
            elif kind == "status_update":
                task.status.CopyFrom(event.status_update.status)
                await _passed_on(task, "", events.progress)
            elif kind == "artifact_update":
                update = event.artifact_update
                parts = list(update.artifact.parts)
                size += sum(part.ByteSize() for part in parts)
                if size > MESSAGE_CEILING:
                    return StreamResponse()
                kept = artifacts.setdefault(update.artifact.artifact_id, [])
                kept[:] = [*kept, *parts] if update.append else parts
                if not update.last_chunk:
                    for part in parts:
                        await _chunk(part, events)
            if task.status.state in _ENDED:
                break
    except asyncio.CancelledError:
        if task.id and task.status.state not in _ENDED:
            await asyncio.shield(_cancel_upstream(client, task.id))
        raise
    del task.artifacts[:]
    answer = task.artifacts.add(artifact_id="answer")
    for part in (p for ps in artifacts.values() for p in ps):
        answer.parts.add().CopyFrom(part)  # parts=[...] or extend would merge each part: slow
    return _task_event(task)


async def _chunk(part: Part, events: CallEvents) -> None:
    if part.HasField("data") and part.data.WhichOneof("kind") == "struct_value":
        await events.chunk(json_format.MessageToDict(part.data.struct_value))
    elif part.HasField("text"):
        await events.chunk({"text": part.text})


def _task_event(task: Task) -> StreamResponse:
    """``task`` as a stream event, copied in (``StreamResponse(task=...)`` merges: slow)."""
    event = StreamResponse()
    event.task.CopyFrom(task)
    return event
