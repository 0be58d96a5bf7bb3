"""Stored tasks → the A2A ``Task``, ``Message`` and stream events a caller sees.

A completed task's output is canonical JSON (:mod:`capabilities.replies`): an
output object becomes one ``data`` artifact (``<task id>-output``, as always);
a ``TaskReply`` its artifacts (``<task id>-output``, ``-output-1``, ...) and,
with a text, the final status message; a ``MessageReply`` that ended a task
someone already saw becomes its final status message. Every artifact carries
the served version, the evidence digest of the whole answer and whether it was
replayed. A task waiting for input shows the prompt as its status message; a
failed or canceled one its reason (``a2agw.reason``).

Messages are written into the answer in place: handing a built ``Task`` to a
message constructor merges it field by field (~1 ms for a 256 KB output).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from a2a.types import a2a_pb2
from google.protobuf import json_format

from capabilities.canonical import CanonicalJson
from capabilities.replies import REPLY_KEY
from gateway.server.a2a import history
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome, TaskPage, page_token
from gateway.server.a2a.wire_parts import JSON_MEDIA_TYPE, fill_message, fill_messages, fill_part
from policies.grants import MAX_PAYLOAD_CEILING

CAPABILITY_KEY = "a2agw.capability"
REASON_KEY = "a2agw.reason"
"""Metadata key of a failed task's reason code (status message and task metadata)."""
SERVED_VERSION_KEY = "a2agw.served_version"
EVIDENCE_KEY = "a2agw.evidence_sha256"
REPLAYED_KEY = "a2agw.replayed"
MAX_LIST_BYTES = MAX_PAYLOAD_CEILING
"""Most bytes of tasks in one ListTasks answer (the gRPC message ceiling less the envelope's)."""
_FIELD_OVERHEAD = 16  # a repeated field's tag and length, generously

_WIRE_STATES = {
    TaskOutcome.COMPLETED: a2a_pb2.TASK_STATE_COMPLETED,
    TaskOutcome.FAILED: a2a_pb2.TASK_STATE_FAILED,
    TaskOutcome.CANCELED: a2a_pb2.TASK_STATE_CANCELED,
    TaskOutcome.SUBMITTED: a2a_pb2.TASK_STATE_SUBMITTED,
    TaskOutcome.WORKING: a2a_pb2.TASK_STATE_WORKING,
    TaskOutcome.INPUT_REQUIRED: a2a_pb2.TASK_STATE_INPUT_REQUIRED,
    TaskOutcome.AUTH_REQUIRED: a2a_pb2.TASK_STATE_AUTH_REQUIRED,
}
WAITING_WIRE_STATES = frozenset(
    {a2a_pb2.TASK_STATE_INPUT_REQUIRED, a2a_pb2.TASK_STATE_AUTH_REQUIRED}
)
"""The interrupted states: the task waits for its caller."""


def task_message(
    task: A2ATask, *, include_artifacts: bool = True, history_length: int | None = None
) -> a2a_pb2.Task:
    """The A2A ``Task`` for a stored task (GetTask, ListTasks, CancelTask)."""
    answer = a2a_pb2.Task()
    fill_task(answer, task, include_artifacts=include_artifacts, history_length=history_length)
    return answer


def send_answer(task: A2ATask, history_length: int | None = None) -> a2a_pb2.SendMessageResponse:
    """The SendMessage answer holding ``task``, built where it is sent."""
    response = a2a_pb2.SendMessageResponse()
    fill_task(response.task, task, history_length=history_length)
    return response


def message_answer(task: A2ATask) -> a2a_pb2.SendMessageResponse:
    """The SendMessage answer of a call the capability answered with a Message (no task)."""
    response = a2a_pb2.SendMessageResponse()
    fill_reply_message(response.message, task)
    return response


def task_event(task: A2ATask) -> a2a_pb2.StreamResponse:
    """The stream event holding ``task`` (a stream's first event), built where it is sent."""
    event = a2a_pb2.StreamResponse()
    fill_task(event.task, task)
    return event


def message_event(task: A2ATask) -> a2a_pb2.StreamResponse:
    """The one event of a stream the capability answered with a Message."""
    event = a2a_pb2.StreamResponse()
    fill_reply_message(event.message, task)
    return event


def fill_task(
    answer: a2a_pb2.Task,
    task: A2ATask,
    *,
    include_artifacts: bool = True,
    history_length: int | None = None,
) -> None:
    """Write ``task`` into the empty ``answer`` in place (see :func:`task_message`)."""
    answer.id = task.task_id
    answer.context_id = task.context_id
    answer.status.timestamp.FromMilliseconds(task.updated_ms)
    answer.status.state = _WIRE_STATES[task.state]
    answer.metadata.update({CAPABILITY_KEY: task.capability})
    if task.served_version:
        answer.metadata[SERVED_VERSION_KEY] = task.served_version
    if task.history:
        kept = history.last(task.history, history_length)
        fill_messages(answer.history, kept, context_id=task.context_id, task_id=task.task_id)
    if task.state is TaskOutcome.COMPLETED:
        _completed(answer, task, include_artifacts=include_artifacts)
        return
    if task.status_json:
        status = orjson.loads(task.status_json)
        fill_message(
            answer.status.message, status, context_id=task.context_id, task_id=task.task_id
        )
    elif task.state.finished or task.message:
        _text_status(answer.status.message, task, task.message)
    if task.state.finished:
        answer.status.message.metadata[REASON_KEY] = task.reason
        answer.metadata[REASON_KEY] = task.reason


def _completed(answer: a2a_pb2.Task, task: A2ATask, *, include_artifacts: bool) -> None:
    value = _decoded(task.output)
    kind = value.get(REPLY_KEY) if isinstance(value, dict) else None
    if kind == "message":  # a Message after the task was seen: its final status message
        status = {"message_id": f"{task.task_id}-reply", "parts": value["parts"]}
        fill_message(
            answer.status.message, status, context_id=task.context_id, task_id=task.task_id
        )
    elif kind == "task" and value.get("text"):
        _text_status(answer.status.message, task, value["text"])
    if include_artifacts:
        # In place: appending a built artifact copies the output.
        fill_artifacts(task, answer.artifacts.add, value)


def fill_artifacts(
    task: A2ATask, new_artifact: Callable[[], a2a_pb2.Artifact], value: Any = None
) -> None:
    """Write each artifact of the completed ``task``, in order, into an empty artifact
    ``new_artifact()`` gives (none for a Message answer). ``value``: the decoded output."""
    if value is None:
        value = _decoded(task.output)
    kind = value.get(REPLY_KEY) if isinstance(value, dict) else None
    if kind is None:
        fill_artifact(new_artifact(), task)
    elif kind == "task":
        for index, artifact in enumerate(value["artifacts"]):
            _fill_reply_artifact(new_artifact(), task, index, artifact)


def final_message_json(task: A2ATask) -> tuple[str, list[dict[str, Any]]] | None:
    """(message id, parts) of a completed task's final status message, for its history
    (a TaskReply's text, a Message answer); None if it has none."""
    value = _decoded(task.output)
    kind = value.get(REPLY_KEY) if isinstance(value, dict) else None
    if kind == "message":
        return f"{task.task_id}-reply", list(value["parts"])
    if kind == "task" and value.get("text"):
        text = {"kind": "text", "text": value["text"], "media_type": "text/plain"}
        return f"{task.task_id}-status", [text]
    return None


def fill_reply_message(message: a2a_pb2.Message, task: A2ATask) -> None:
    """Write the Message a capability answered ``task``'s call with into the empty ``message``."""
    value = _decoded(task.output)
    fill_message(
        message,
        {"message_id": f"{task.task_id}-reply", "parts": value["parts"]},
        context_id=task.context_id,
    )
    message.metadata.update(
        {
            CAPABILITY_KEY: task.capability,
            SERVED_VERSION_KEY: task.served_version,
            EVIDENCE_KEY: task.evidence_sha256,
            REPLAYED_KEY: task.remembered,
        }
    )


def _text_status(message: a2a_pb2.Message, task: A2ATask, text: str) -> None:
    message.message_id = f"{task.task_id}-status"
    message.context_id = task.context_id
    message.task_id = task.task_id
    message.role = a2a_pb2.ROLE_AGENT
    message.parts.add(text=text)


def list_answer(
    page: TaskPage, *, include_artifacts: bool, history_length: int | None = None
) -> a2a_pb2.ListTasksResponse:
    """The ListTasks answer for ``page``, cut short to fit one gRPC message.

    A page of large outputs can exceed what gRPC sends; the page then ends at
    the last task that fits and its token continues right after that task.
    """
    response = a2a_pb2.ListTasksResponse(total_size=page.total_size)
    answers = response.tasks  # each task written in place: passing built ones copies them
    used, token, size = 0, page.next_page_token, page.page_size
    for task in page.tasks:
        answer = answers.add()
        fill_task(answer, task, include_artifacts=include_artifacts, history_length=history_length)
        used += answer.ByteSize() + _FIELD_OVERHEAD
        if len(answers) > 1 and used > MAX_LIST_BYTES:
            del answers[-1]
            token = page_token(answers[-1].id)
            size = len(answers)  # the page size this answer used: what one message holds
            break
    response.next_page_token = token
    response.page_size = size  # the spec's "page size used", not the tasks a last page holds
    return response


def output_artifact(task: A2ATask) -> a2a_pb2.Artifact:
    """A completed task's one artifact: the capability's output and its evidence."""
    artifact = a2a_pb2.Artifact()
    fill_artifact(artifact, task)
    return artifact


def fill_artifact(artifact: a2a_pb2.Artifact, task: A2ATask) -> None:
    """Write a completed task's one output-object artifact into the empty ``artifact``."""
    # The output is decoded straight into the part's Value: every copy of a
    # message holding it (CopyFrom, append) copies the whole output again.
    artifact.artifact_id = f"{task.task_id}-output"
    artifact.name = task.capability
    part = artifact.parts.add(media_type=JSON_MEDIA_TYPE)
    decoded = _decoded(task.output)
    if isinstance(decoded, dict):
        part.data.struct_value.update(decoded)
    else:  # outputs are objects by contract; anything else still travels faithfully
        json_format.ParseDict(decoded, part.data)
    _evidence(artifact, task)


def _fill_reply_artifact(
    artifact: a2a_pb2.Artifact, task: A2ATask, index: int, value: dict[str, Any]
) -> None:
    suffix = "" if index == 0 else f"-{index}"
    artifact.artifact_id = f"{task.task_id}-output{suffix}"
    if value.get("name"):
        artifact.name = value["name"]
    if value.get("description"):
        artifact.description = value["description"]
    for part in value["parts"]:
        fill_part(artifact.parts.add(), part)
    _evidence(artifact, task)


def _evidence(artifact: a2a_pb2.Artifact, task: A2ATask) -> None:
    artifact.metadata.update(
        {
            SERVED_VERSION_KEY: task.served_version,
            EVIDENCE_KEY: task.evidence_sha256,
            REPLAYED_KEY: task.remembered,
        }
    )


def _decoded(payload: bytes) -> Any:
    if isinstance(payload, CanonicalJson):  # an output just run: its value, not a re-read
        return payload.value
    # orjson reads an integer beyond 64 bits as a float where json keeps an int;
    # a Value holds every number as a double, so the Value comes out the same.
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)  # what only json reads, e.g. NaN
