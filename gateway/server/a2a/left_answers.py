"""Answers to a waiting task, admitted by another process and left in the store for this one.

With workers or replicas, a follow-up may reach a process that does not run its
task (``gateway.server.a2a.conversations``). That process admits it and leaves
it in ``a2a_task_inputs``; the process running the task looks for answers to its
waiting tasks every ``INPUT_POLL_SECONDS`` (only while one of them waits) and,
for each, claims the question, validates the answer against the question's
schema (as its sender did), takes the row (one conditional update: the sender
may have withdrawn it meanwhile), audits the follow-up ``allow`` (committed
first for a capability that may write, as for a local answer) and hands it to
the capability. An answer it cannot take (the task no longer waits on that
question) is ``refused``, and the sender audits that refusal: each follow-up
has exactly one record, written by the side that decided. The sender checked
the answer's user against the task's row before leaving it; the record
written here names the task's user (the same subject), through the first
message's verified tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import orjson
from pydantic import ValidationError

from capabilities.parts import AnyObject
from capabilities.replies import part_from_json
from gateway.errors import GatewayError
from gateway.inbound.call import InvokeCall
from gateway.inbound.invoke_handler import AdmittedCall, InvokeHandler
from gateway.server.a2a.task_store.inputs import REFUSED, TAKEN, PendingInput
from gateway.server.a2a.task_store.store import A2ATaskStore

if TYPE_CHECKING:
    from gateway.server.a2a.background_tasks import BackgroundTasks

_log = logging.getLogger(__name__)

INPUT_POLL_SECONDS = 0.25
"""How often a process with a waiting task looks for answers left by other processes."""


async def take_left_answers(
    runs: BackgroundTasks, store: A2ATaskStore, handler: InvokeHandler
) -> None:
    """Forever: hand the answers other processes left to this process's waiting tasks."""
    while True:
        await asyncio.sleep(INPUT_POLL_SECONDS)
        if not runs.waiting():
            continue  # nothing waits here: no query at all
        try:
            left = await store.pending_inputs(runs.process_id)
        except GatewayError as err:
            _log.warning("A2A answers left by other processes not read: %s", err.message)
            continue
        for pending in left:
            try:
                await _take(runs, store, handler, pending)
            except GatewayError as err:  # the next round tries again
                _log.warning("A2A task %s: answer not taken: %s", pending.task_id, err.message)


async def _take(
    runs: BackgroundTasks, store: A2ATaskStore, handler: InvokeHandler, pending: PendingInput
) -> None:
    run = runs.running(pending.task_id)
    question = None if run is None else run.waiting
    if run is None or question is None or not run.claim(question):
        await store.end_input(pending.task_id, pending.message_id, REFUSED)
        return
    try:
        schema = question.schema if question.schema is not None else AnyObject
        payload = schema.model_validate_json(pending.input)
        parts = tuple(part_from_json(part) for part in orjson.loads(pending.parts))
    except (ValidationError, ValueError, TypeError):  # not what it was asked (the sender checked)
        question.claimed = False
        await store.end_input(pending.task_id, pending.message_id, REFUSED)
        return
    try:
        taken = await store.end_input(pending.task_id, pending.message_id, TAKEN)
    except GatewayError:
        question.claimed = False
        raise
    if not taken:  # withdrawn by its sender meanwhile: another answer may come
        question.claimed = False
        return
    task = run.task
    call = InvokeCall(
        None,
        pending.message_id,
        task.capability,
        f"={task.served_version}",
        pending.input,
        0.0,
        task_id=task.task_id,
        tokens=run.admitted.call.tokens,  # the task's user: the record's on_behalf_of
    )
    admitted = AdmittedCall(call, run.admitted.admission, payload, time.perf_counter())
    await handler.settle_follow_up(admitted, None)
    run.answer(question, payload, pending.message_id, parts)
