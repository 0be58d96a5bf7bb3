"""Probe: an upstream task the gateway gives up on, or an answer about another task.

bob fronts a scripted gRPC A2A upstream. Two defects found by probing:

1. A task the upstream leaves unfinished (``INPUT_REQUIRED``/``AUTH_REQUIRED``, or a
   stream that ends while it is still ``WORKING``) failed the call
   (``CAPABILITY_FAILED``) but was never cancelled upstream: the upstream kept
   the parked or running task for ever. A streamed ``INPUT_REQUIRED`` kept the
   call waiting for the skill's timeout (``CAPABILITY_TIMEOUT``). Since issue 33
   a caller over A2A gets the question at once (its task waits in that state)
   and the upstream task is cancelled when the call ends unanswered; a call that
   cannot ask (Invoke) still fails and cancels it.
2. A ``GetTask`` answer (or stream event) for another task than the one asked
   about was taken as this call's answer: the caller got that other task's
   output, and a later cancel went to that other task.

Each test checks alice's outcome, bob's single audit record, what the upstream
received (its CancelTask ids) and that bob keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc

from gateway.errors import CapabilityFailed, GatewayError, InvalidOutput
from tests.helpers.a2a_hostile_upstream import (
    COMPLETED,
    TASK,
    WORKING,
    artifact_event,
    audited,
    ending,
    eventually,
    scripted_grpc_upstream,
    status_event,
    still_serving,
    stream_from,
    task_event,
)
from tests.helpers.agents import Pki
from tests.helpers.fronting import LEGACY, client, fronted

INPUT_REQUIRED = a2a_pb2.TASK_STATE_INPUT_REQUIRED
AUTH_REQUIRED = a2a_pb2.TASK_STATE_AUTH_REQUIRED
OTHER = "someone-elses-task"


def _task(state: int, task_id: str = TASK, text: str = "") -> a2a_pb2.Task:
    task = task_event(state, {"answer": text} if text else None).task
    task.id = task_id
    return task


def _answer(task: a2a_pb2.Task) -> a2a_pb2.SendMessageResponse:
    answer = a2a_pb2.SendMessageResponse()
    answer.task.CopyFrom(task)
    return answer


@dataclass
class Upstream(a2a_pb2_grpc.A2AServiceServicer):
    """Answers SendMessage, GetTask and the stream as set; records every request."""

    first: a2a_pb2.Task = field(default_factory=lambda: _task(WORKING))
    polled: a2a_pb2.Task = field(default_factory=lambda: _task(WORKING))
    stream: list[a2a_pb2.StreamResponse] = field(default_factory=list)
    hold: bool = True
    """Keep the stream open after its events (until the client ends it)."""
    sent: int = 0
    polls: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.SendMessageResponse:
        self.sent += 1
        return _answer(self.first)

    async def GetTask(
        self, request: a2a_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        self.polls.append(request.id)
        return self.polled

    async def SendStreamingMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        self.sent += 1
        for event in self.stream:
            yield event
        if self.hold:
            await asyncio.Event().wait()

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        self.cancels.append(request.id)
        return _task(a2a_pb2.TASK_STATE_CANCELED, request.id)

    def serve_fine(self) -> None:
        self.first, self.stream = _task(COMPLETED, text="fine"), []


async def _invoke(pki: Pki, fake: Upstream, tmp_path: Path) -> tuple[object, list, object]:
    """alice's blocking Invoke of legacy.echo through bob: outcome, audit, a later call."""
    async with scripted_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up, timeout=5.0) as bob:
            async with client(pki, bob) as peer:
                try:
                    result: object = (await peer.invoke("legacy.echo", {"text": "hi"})).output()
                except GatewayError as err:
                    result = err
            rows = await audited(bob)
            await asyncio.sleep(0.3)  # a background CancelTask has time to arrive
            sent, cancels = fake.sent, list(fake.cancels)
            fake.serve_fine()
            again = await still_serving(pki, bob)
    fake.sent, fake.cancels = sent, cancels  # what the probed call alone caused
    return result, rows, again


# --- 1. unfinished upstream tasks are cancelled when the call gives up on them ---------

INTERRUPTED = {"input required": INPUT_REQUIRED, "auth required": AUTH_REQUIRED}


@pytest.mark.parametrize("state", INTERRUPTED.values(), ids=INTERRUPTED.keys())
async def test_a_polled_task_that_wants_input_fails_and_is_cancelled_upstream(
    pki: Pki, tmp_path: Path, state: int
) -> None:
    fake = Upstream(first=_task(WORKING), polled=_task(state))
    result, rows, again = await _invoke(pki, fake, tmp_path)
    assert isinstance(result, CapabilityFailed)
    assert rows == [("CAPABILITY_FAILED", "")]
    assert fake.sent == 1
    assert fake.cancels == [TASK]  # not left parked upstream for ever
    assert again == {"text": "fine"}


@pytest.mark.parametrize("state", INTERRUPTED.values(), ids=INTERRUPTED.keys())
async def test_a_first_answer_that_wants_input_fails_and_is_cancelled_upstream(
    pki: Pki, tmp_path: Path, state: int
) -> None:
    fake = Upstream(first=_task(state))
    result, rows, again = await _invoke(pki, fake, tmp_path)
    assert isinstance(result, CapabilityFailed)
    assert rows == [("CAPABILITY_FAILED", "")]
    assert (fake.sent, fake.polls) == (1, [])
    assert fake.cancels == [TASK]
    assert again == {"text": "fine"}


def _streaming(address: str) -> dict[str, object]:
    return {"id": LEGACY, "binding": "grpc", "address": address, "streaming": True}


@pytest.mark.parametrize("state", INTERRUPTED.values(), ids=INTERRUPTED.keys())
async def test_a_streamed_task_that_wants_input_fails_at_once_and_is_cancelled(
    pki: Pki, tmp_path: Path, state: int
) -> None:
    # The stream stays open after the interrupted state (as a broken upstream may).
    # The skill does not ask its caller (a text skill's default).
    fake = Upstream(stream=[task_event(a2a_pb2.TASK_STATE_SUBMITTED), status_event(state)])
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, _streaming(address), timeout=5.0) as bob:
            started = asyncio.get_running_loop().time()
            seen, broke = await stream_from(pki, bob)
            took = asyncio.get_running_loop().time() - started
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            rows = await audited(bob)
            sent = fake.sent
            fake.serve_fine()
            again = await still_serving(pki, bob)
    assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "CAPABILITY_FAILED"))
    assert took < 4.0  # not held until the skill's 5 s timeout
    assert rows == [("CAPABILITY_FAILED", "")]
    assert sent == 1
    assert again == {"text": "fine"}


@pytest.mark.parametrize("state", INTERRUPTED.values(), ids=INTERRUPTED.keys())
async def test_a_streamed_task_that_wants_input_is_passed_on_at_once_then_cancelled(
    pki: Pki, tmp_path: Path, state: int
) -> None:
    # As above, for a skill that asks its caller: the caller's task waits in that state
    # at once (its stream ends there); the upstream task is cancelled when the skill's
    # timeout ends with nobody having answered.
    fake = Upstream(stream=[task_event(a2a_pb2.TASK_STATE_SUBMITTED), status_event(state)])
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, _streaming(address), timeout=2.0, asks_input=True) as bob:
            seen, broke = await stream_from(pki, bob)
            waiting = list(fake.cancels)
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            rows = await audited(bob)
            sent = fake.sent
            fake.serve_fine()
            again = await still_serving(pki, bob)
    assert (broke, ending(seen)) == ("", (a2a_pb2.TaskState.Name(state), ""))
    # Not held until the skill's timeout: that cancels the upstream task, which had not
    # happened when the caller's stream ended.
    assert waiting == []
    assert rows == [("CAPABILITY_TIMEOUT", "")]
    assert sent == 1
    assert again == {"text": "fine"}


async def test_a_stream_that_ends_while_its_task_works_cancels_the_task(
    pki: Pki, tmp_path: Path
) -> None:
    fake = Upstream(stream=[task_event(WORKING)], hold=False)
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, _streaming(address), timeout=5.0) as bob:
            seen, broke = await stream_from(pki, bob)
            await asyncio.sleep(0.3)
            cancels = list(fake.cancels)
            rows = await audited(bob)
            fake.serve_fine()
            again = await still_serving(pki, bob)
    assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "CAPABILITY_FAILED"))
    assert rows == [("CAPABILITY_FAILED", "")]
    assert cancels == [TASK]  # the task still runs upstream: it is cancelled
    assert again == {"text": "fine"}


# --- 2. an answer about another task is not this call's answer ------------------------


async def test_a_get_task_answer_for_another_task_is_invalid_output(
    pki: Pki, tmp_path: Path
) -> None:
    fake = Upstream(first=_task(WORKING), polled=_task(COMPLETED, OTHER, "another's output"))
    result, rows, again = await _invoke(pki, fake, tmp_path)
    assert isinstance(result, InvalidOutput)  # before: OK, {"text": "another's output"}
    assert rows == [("INVALID_OUTPUT", "")]
    assert fake.polls == [TASK]
    assert fake.cancels == [TASK]  # our own task, never the other one
    assert again == {"text": "fine"}


def _for_other(event: a2a_pb2.StreamResponse) -> a2a_pb2.StreamResponse:
    kind = event.WhichOneof("payload")
    if kind == "task":
        event.task.id = OTHER
    else:
        getattr(event, kind).task_id = OTHER
    return event


FOREIGN_EVENTS = {
    "artifact update": _for_other(
        artifact_event(a2a_pb2.Part(text="another's output"), append=False, last=True)
    ),
    "status update": _for_other(status_event(COMPLETED)),
    "task": _for_other(task_event(COMPLETED, {"answer": "another's output"})),
}


@pytest.mark.parametrize("foreign", FOREIGN_EVENTS.values(), ids=FOREIGN_EVENTS.keys())
async def test_a_stream_event_for_another_task_is_invalid_output(
    pki: Pki, tmp_path: Path, foreign: a2a_pb2.StreamResponse
) -> None:
    stream = [task_event(WORKING), foreign, status_event(COMPLETED)]
    fake = Upstream(stream=stream)
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, _streaming(address), timeout=5.0) as bob:
            seen, broke = await stream_from(pki, bob)
            await eventually(lambda: fake.cancels == [TASK], "our upstream task cancelled")
            rows = await audited(bob)
            fake.serve_fine()
            again = await still_serving(pki, bob)
    assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "INVALID_OUTPUT"))
    assert rows == [("INVALID_OUTPUT", "")]
    assert OTHER not in fake.cancels
    assert again == {"text": "fine"}
