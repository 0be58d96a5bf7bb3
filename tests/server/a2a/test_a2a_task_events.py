"""A run's listeners: the task first, events in order, the end; a lagging one is let go.

Pure event-loop logic (no server): ``BackgroundTask`` with a stored-task value and
no admitted call (listening never reads it).
"""

from __future__ import annotations

from dataclasses import replace

from a2a.types import a2a_pb2

from gateway.server.a2a.task_events import MAX_BEHIND, BackgroundTask, status_event
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome
from gateway.server.a2a.task_view import task_message
from tests.helpers.a2a_grpc import a2a_task


def _task(state: TaskOutcome = TaskOutcome.SUBMITTED, **changes: object) -> A2ATask:
    task = a2a_task(
        "t-1",
        "spiffe://example.org/agent/bob",
        "job.run",
        context_id="c-1",
        state=state,
        created_ms=1,
        updated_ms=2,
    )
    return replace(task, **changes)  # type: ignore[arg-type]


def _run(task: A2ATask) -> BackgroundTask:
    return BackgroundTask(task, admitted=None)  # type: ignore[arg-type]


async def test_a_listener_gets_the_task_then_every_event_then_ends() -> None:
    run = _run(_task())
    listener = run.listen()
    working = _task(TaskOutcome.WORKING, message="halfway")
    run.publish(status_event(working))
    failed = _task(TaskOutcome.FAILED, reason="CAPABILITY_FAILED", message="job.run failed")
    run.publish(status_event(failed), last=True)
    run.publish(status_event(working))  # after the end: never delivered
    seen = [event async for event in listener.events()]
    kinds = [event.WhichOneof("payload") for event in seen]
    assert kinds == ["task", "status_update", "status_update"]
    assert seen[0].task.status.state == a2a_pb2.TASK_STATE_SUBMITTED
    assert seen[1].status_update.status.message.parts[0].text == "halfway"
    end = seen[2].status_update.status
    assert end.state == a2a_pb2.TASK_STATE_FAILED
    assert end.message.metadata["a2agw.reason"] == "CAPABILITY_FAILED"
    assert run.listeners == set()  # the stream that ended let go of the run


async def test_a_listener_that_falls_behind_gets_the_task_as_it_is_and_ends() -> None:
    run = _run(_task(TaskOutcome.WORKING))
    listener = run.listen()
    for n in range(MAX_BEHIND + 10):
        run.task = _task(TaskOutcome.WORKING, message=f"step {n}")
        run.publish(status_event(run.task))
    seen = [event async for event in listener.events()]
    assert len(seen) == MAX_BEHIND + 1
    assert seen[-1].WhichOneof("payload") == "task"
    assert seen[-1].task.status.message.parts[0].text == f"step {MAX_BEHIND - 1}"


async def test_listening_to_a_run_that_has_ended_is_its_last_state_only() -> None:
    run = _run(_task(TaskOutcome.CANCELED, reason="CANCELLED", message="canceled by bob"))
    run.ended.set()
    seen = [event async for event in run.listen().events()]
    assert [event.task.status.state for event in seen] == [a2a_pb2.TASK_STATE_CANCELED]


def test_every_state_has_its_wire_state_and_only_ends_carry_a_reason() -> None:
    wire = {
        TaskOutcome.SUBMITTED: a2a_pb2.TASK_STATE_SUBMITTED,
        TaskOutcome.WORKING: a2a_pb2.TASK_STATE_WORKING,
        TaskOutcome.COMPLETED: a2a_pb2.TASK_STATE_COMPLETED,
        TaskOutcome.FAILED: a2a_pb2.TASK_STATE_FAILED,
        TaskOutcome.CANCELED: a2a_pb2.TASK_STATE_CANCELED,
    }
    for state, expected in wire.items():
        answer = task_message(_task(state, output=b'{"done": "x"}', reason="R"))
        assert answer.status.state == expected
        assert ("a2agw.reason" in answer.metadata) is (
            state in (TaskOutcome.FAILED, TaskOutcome.CANCELED)
        )
        assert state.finished is (state not in (TaskOutcome.SUBMITTED, TaskOutcome.WORKING))
    assert not task_message(_task(TaskOutcome.WORKING)).status.HasField("message")
