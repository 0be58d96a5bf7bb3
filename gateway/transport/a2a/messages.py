"""A2A messages ⇄ the protocol-neutral call, and stored tasks → A2A ``Task``.

A SendMessage becomes one :class:`~gateway.inbound.call.InvokeCall`:

* capability: message metadata ``a2agw.capability`` = ``NAME[@CONSTRAINT]``;
* request id: ``message_id`` (replay protection, as ``request_id`` for Invoke);
* idempotency key: message metadata ``a2agw.idempotency_key`` (optional);
* payload: exactly one part, either ``data`` holding a JSON object (serialized
  compactly with sorted keys, as a Struct keeps no key order; whole numbers made
  integers where the input schema says integer)
  or ``raw`` bytes with media type ``application/json`` (used unchanged: the
  payload cap and the digest apply to those bytes).

Anything else becomes ``InvokeCall.problem``, which the pipeline answers with
INVALID_REQUEST once it knows who is asking. Problems never quote payload content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from a2a.types import a2a_pb2
from google.protobuf import json_format, struct_pb2
from pydantic import BaseModel

from capabilities.canonical import canonical_json
from gateway.inbound.call import InvokeCall
from gateway.transport.a2a.json_numbers import restore_integers
from gateway.transport.a2a.task_store import A2ATask, TaskOutcome

CAPABILITY_KEY = "a2agw.capability"
"""Message metadata key naming the capability: ``NAME`` or ``NAME@CONSTRAINT``."""
IDEMPOTENCY_KEY = "a2agw.idempotency_key"
"""Message metadata key of the idempotency key (write capabilities run once per key)."""
REASON_KEY = "a2agw.reason"
"""Metadata key of a failed task's reason code (status message and task metadata)."""
SERVED_VERSION_KEY = "a2agw.served_version"
EVIDENCE_KEY = "a2agw.evidence_sha256"
REPLAYED_KEY = "a2agw.replayed"
JSON_MEDIA_TYPE = "application/json"

InputModels = Callable[[str], Sequence[type[BaseModel]]]
"""Capability name → the input models of its registered versions (for integers)."""


class _Problem(Exception):
    """Why a SendMessage cannot become a call (becomes ``InvokeCall.problem``)."""


def invoke_call(
    request: a2a_pb2.SendMessageRequest,
    *,
    peer_cert_pem: bytes | None,
    deadline: float,
    task_id: str,
    input_models: InputModels,
) -> InvokeCall:
    """The call a SendMessage asks for; ``problem`` says why it is not one."""
    message = request.message
    capability = constraint = idempotency_key = problem = ""
    payload = b""
    try:
        _check_envelope(request)
        capability, constraint = _capability(message)
        idempotency_key = _text_metadata(message, IDEMPOTENCY_KEY)
        payload = _payload(message, input_models(capability))
    except _Problem as err:
        problem = str(err)
    return InvokeCall(
        peer_cert_pem=peer_cert_pem,
        request_id=message.message_id,
        capability=capability,
        version_constraint=constraint,
        payload=payload,
        deadline=deadline,
        task_id=task_id,
        idempotency_key=idempotency_key,
        problem=problem,
    )


def _check_envelope(request: a2a_pb2.SendMessageRequest) -> None:
    if request.tenant:
        raise _Problem("tenants are not supported by this agent; send an empty tenant")
    if not request.HasField("message"):
        raise _Problem("SendMessageRequest.message is missing")
    if request.message.task_id:
        raise _Problem("every message starts a new task here; send it without task_id")
    if request.configuration.HasField("task_push_notification_config"):
        raise _Problem("push notifications are not supported by this agent")


def _capability(message: a2a_pb2.Message) -> tuple[str, str]:
    text = _text_metadata(message, CAPABILITY_KEY)
    if not text:
        raise _Problem(f"message metadata {CAPABILITY_KEY!r} (NAME[@CONSTRAINT]) is missing")
    name, _, constraint = text.partition("@")
    if not name.strip():
        raise _Problem(f"message metadata {CAPABILITY_KEY!r} names no capability")
    return name.strip(), constraint.strip()


def _text_metadata(message: a2a_pb2.Message, key: str) -> str:
    value = message.metadata.fields.get(key)
    if value is None:
        return ""
    if value.WhichOneof("kind") != "string_value":
        raise _Problem(f"message metadata {key!r} must be a string")
    return str(value.string_value)


def _payload(message: a2a_pb2.Message, models: Sequence[type[BaseModel]]) -> bytes:
    if len(message.parts) != 1:
        raise _Problem(f"the message must have exactly one part, it has {len(message.parts)}")
    part = message.parts[0]
    kind = part.WhichOneof("content")
    if kind == "raw":
        if part.media_type != JSON_MEDIA_TYPE:
            raise _Problem(f"a raw part must have media_type {JSON_MEDIA_TYPE!r}")
        return bytes(part.raw)
    if kind == "data":
        if part.data.WhichOneof("kind") != "struct_value":
            raise _Problem("a data part must hold a JSON object")
        try:
            value = json_format.MessageToDict(part.data)
            restored = restore_integers(value, models)
            return canonical_json(restored, allow_nan=False)
        except (ValueError, json_format.Error) as err:
            raise _Problem("the data part holds a number JSON cannot carry") from err
    raise _Problem(f"a {kind or 'empty'} part cannot carry a payload; send data or raw JSON")


def task_message(task: A2ATask, *, include_artifacts: bool = True) -> a2a_pb2.Task:
    """The A2A ``Task`` for a stored task (SendMessage, GetTask, ListTasks, CancelTask)."""
    answer = a2a_pb2.Task(id=task.task_id, context_id=task.context_id)
    answer.status.timestamp.FromMilliseconds(task.updated_ms)
    answer.metadata.update({"a2agw.capability": task.capability})
    if task.served_version:
        answer.metadata[SERVED_VERSION_KEY] = task.served_version
    if task.state is not TaskOutcome.COMPLETED:
        return _unfinished_or_failed(answer, task)
    answer.status.state = a2a_pb2.TASK_STATE_COMPLETED
    if include_artifacts:
        answer.artifacts.append(output_artifact(task))
    return answer


_WIRE_STATES = {
    TaskOutcome.FAILED: a2a_pb2.TASK_STATE_FAILED,
    TaskOutcome.CANCELED: a2a_pb2.TASK_STATE_CANCELED,
    TaskOutcome.SUBMITTED: a2a_pb2.TASK_STATE_SUBMITTED,
    TaskOutcome.WORKING: a2a_pb2.TASK_STATE_WORKING,
}


def _unfinished_or_failed(answer: a2a_pb2.Task, task: A2ATask) -> a2a_pb2.Task:
    """A failed or canceled task carries its reason; a running one its latest progress text."""
    answer.status.state = _WIRE_STATES[task.state]
    if task.state.finished or task.message:
        answer.status.message.CopyFrom(
            a2a_pb2.Message(
                message_id=f"{task.task_id}-status",
                context_id=task.context_id,
                task_id=task.task_id,
                role=a2a_pb2.ROLE_AGENT,
                parts=[a2a_pb2.Part(text=task.message)],
            )
        )
    if task.state.finished:
        answer.status.message.metadata[REASON_KEY] = task.reason
        answer.metadata[REASON_KEY] = task.reason
    return answer


def output_artifact(task: A2ATask) -> a2a_pb2.Artifact:
    """A completed task's one artifact: the capability's output and its evidence."""
    artifact = a2a_pb2.Artifact(artifact_id=f"{task.task_id}-output", name=task.capability)
    part = artifact.parts.add(media_type=JSON_MEDIA_TYPE)
    part.data.CopyFrom(_json_value(task.output))
    artifact.metadata.update(
        {
            SERVED_VERSION_KEY: task.served_version,
            EVIDENCE_KEY: task.evidence_sha256,
            REPLAYED_KEY: task.replayed,
        }
    )
    return artifact


def _json_value(payload: bytes) -> struct_pb2.Value:
    value = struct_pb2.Value()
    decoded = _decoded(payload)
    if isinstance(decoded, dict):
        value.struct_value.update(decoded)
    else:  # outputs are objects by contract; anything else still travels faithfully
        json_format.ParseDict(decoded, value)
    return value


def _decoded(payload: bytes) -> Any:
    # orjson reads an integer beyond 64 bits as a float where json keeps an int;
    # a Value holds every number as a double, so the Value comes out the same.
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)  # what only json reads, e.g. NaN
