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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from a2a.client import Client, ClientCallContext
from a2a.types import CancelTaskRequest, GetTaskRequest, StreamResponse, Task, TaskState

_log = logging.getLogger(__name__)

FIRST_POLL_SECONDS = 0.01
MAX_POLL_SECONDS = 1.0
CANCEL_SECONDS = 2.0
_RUNNING = frozenset({TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING})

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
    return StreamResponse(task=task)


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
