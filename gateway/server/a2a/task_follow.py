"""Following a task that another process of this agent runs, through the shared store.

A subscription reaches any worker or replica, but a run's events live only in
the process running it (:mod:`gateway.server.a2a.background_tasks`). Elsewhere,
:func:`followed` reads the task's row: the task as it is, then a status
update at each change of state it sees and at each new progress text (the
running process saves the latest one to the row, at most every
``PROGRESS_SAVE_SECONDS``; texts reported between two polls come as the
latest), each output chunk emitted after the follow began (the running
process keeps them in the store, with the same saves), and at the end the
output artifact (when it completed) and the terminal status, as a local
listener would. Chunks still unread when the task ends are not sent: the
output artifact holds them all.

The row is polled (``FIRST_POLL_SECONDS``, doubling to ``MAX_POLL_SECONDS``,
back to the first pause after each change), not pushed: the same reads work
on SQLite (``workers``) and PostgreSQL (replicas), and a read by owner and id
is the indexed query ``GetTask`` runs, so a subscription costs at most about
one such query a second; a LISTEN connection per subscriber would cost more
and would not exist for SQLite.

A follow is bounded: the running process ends the task within its contract
timeout, and if that process dies the lease sweep ends it within
``LEASE_SECONDS + LEASE_RENEW_SECONDS``. A row still unfinished after both
(counted from its creation) is not followed further: ``DEADLINE_EXCEEDED``.
When this process stops, a follow ends with ``AGENT_STOPPING`` (the task
runs on elsewhere; subscribe again there, or poll ``GetTask``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

from a2a.types import a2a_pb2

from gateway.errors import AgentStopping, DeadlineExceeded, TaskNotFound
from gateway.server.a2a.background_tasks import LEASE_RENEW_SECONDS, LEASE_SECONDS
from gateway.server.a2a.task_events import chunk_event, output_events, status_event
from gateway.server.a2a.task_store.store import A2ATask, A2ATaskStore, TaskOutcome
from gateway.server.a2a.task_view import task_event

FIRST_POLL_SECONDS = 0.05
MAX_POLL_SECONDS = 1.0
SWEEP_SECONDS = LEASE_SECONDS + LEASE_RENEW_SECONDS + 1.0
"""How long after its timeout a task of a dead process may stay unfinished (one sweep late)."""
TIMED_OUT = (
    "the task did not end within its contract timeout and the lease of the process running it; "
    "poll GetTask"
)
STOPPING = "the agent is stopping; the task runs on: subscribe again, or poll GetTask"


def follow_deadline(task: A2ATask, timeout_seconds: float) -> float:
    """Epoch seconds after which an unfinished ``task`` is no longer followed."""
    # A run's deadline is a second past its timeout (task_runs' _unhurried).
    return task.created_ms / 1000 + timeout_seconds + 1.0 + SWEEP_SECONDS


async def followed(
    store: A2ATaskStore,
    task: A2ATask,
    deadline: float,
    stopping: asyncio.Event,
    *,
    until_waiting: bool = False,
) -> AsyncIterator[a2a_pb2.StreamResponse]:
    """``task`` as it is, then its changes as the store shows them; the last event terminal
    (``until_waiting``: or the first in which it waits for its caller, as a
    SendStreamingMessage's stream ends there).

    Raises:
        DeadlineExceeded: ``deadline`` (epoch seconds) passed with the task unfinished.
        AgentStopping: ``stopping`` was set.
        StateUnavailable: the store could not be read.
        TaskNotFound: the row is gone (it cannot be, unfinished, unless deleted by hand).
    """
    # Counted before the task is sent: a stream's consumer may be slow to ask for
    # the next event, and chunks kept meanwhile were emitted after the follow began.
    chunks = await store.chunk_count(task.owner, task.task_id)
    yield task_event(task)
    if until_waiting and task.state.waiting:
        return
    seen, said = task.state, task.message
    pause = FIRST_POLL_SECONDS
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise DeadlineExceeded(TIMED_OUT)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(pause, left)):
                await stopping.wait()
        if stopping.is_set():
            raise AgentStopping(STOPPING)
        latest = await store.get(task.owner, task.task_id, task.user)
        if latest is None:
            raise TaskNotFound("task not found")
        if latest.state.finished:
            if latest.state is TaskOutcome.COMPLETED:
                for event in output_events(latest):
                    yield event
            yield status_event(latest)
            return
        changed = False
        if latest.state is not seen or latest.message != said:
            seen, said = latest.state, latest.message
            changed = True
            yield status_event(latest)
            if until_waiting and latest.state.waiting:
                return
        for chunk in await store.chunks_from(task.owner, task.task_id, chunks):
            changed = True
            yield chunk_event(latest, json.loads(chunk), first=chunks == 0)
            chunks += 1
        pause = FIRST_POLL_SECONDS if changed else min(pause * 2, MAX_POLL_SECONDS)
