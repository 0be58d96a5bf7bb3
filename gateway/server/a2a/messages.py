"""A2A messages ⇄ the protocol-neutral call, and stored tasks → A2A ``Task``.

A SendMessage becomes one :class:`~gateway.inbound.call.InvokeCall`:

* capability: message metadata ``a2agw.capability`` = ``NAME[@CONSTRAINT]``,
  passed on exactly as sent (never stripped: the pipeline refuses what Invoke
  refuses); without it, the agent's ``[a2a] default_capability`` if set;
* request id: ``message_id`` (replay protection, as ``request_id`` for Invoke);
* idempotency key: message metadata ``a2agw.idempotency_key`` (optional);
* payload: exactly one part, either ``data`` holding a JSON object, ``raw``
  bytes with media type ``application/json`` (used unchanged: the payload cap
  and the digest apply to those bytes), or ``text``: the input ``{"text": ...}``
  of a version whose input is exactly one string field ``text`` (else
  INVALID_INPUT, once that version is chosen).

A ``data`` (or ``text``) part is not converted here: it becomes a pending
payload whose size is the serialized size of its ``Value`` (the text's UTF-8
bytes), which the payload cap counts before anything is decoded. Only a call
admitted up to the cap has it decoded (JSON, compact with sorted keys, as a
Struct keeps no key order; whole numbers made integers where the chosen
version's input schema says integer), and that JSON must be within the cap too.

Metadata (the message's or the request's) that claims who is calling
(:data:`IDENTITY_KEYS`) becomes ``InvokeCall.claimed_identity``, refused
UNAUTHENTICATED: only the TLS handshake names the caller.

Every other ``a2agw.*`` metadata value must be a string, and ``context_id`` an
id (empty, or 1-128 of ``[A-Za-z0-9._:-]``). Anything else becomes
``InvokeCall.problem``, which the pipeline answers with INVALID_REQUEST once it
knows who is asking. Problems never quote payload content.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from a2a.types import a2a_pb2
from google.protobuf import json_format, struct_pb2

from capabilities.canonical import CanonicalJson
from gateway.display import printable
from gateway.identity import PresentedTokens
from gateway.inbound.call import REQUEST_ID, InvokeCall
from gateway.server.a2a.task_store.store import A2ATask, TaskOutcome, TaskPage, page_token
from gateway.transport.a2a.part_payloads import DataPart, TextPart
from policies.grants import MAX_PAYLOAD_CEILING

CAPABILITY_KEY = "a2agw.capability"
"""Message metadata key naming the capability: ``NAME`` or ``NAME@CONSTRAINT``."""
IDEMPOTENCY_KEY = "a2agw.idempotency_key"
"""Message metadata key of the idempotency key (write capabilities run once per key)."""
REASON_KEY = "a2agw.reason"
"""Metadata key of a failed task's reason code (status message and task metadata)."""
SERVED_VERSION_KEY = "a2agw.served_version"
EVIDENCE_KEY = "a2agw.evidence_sha256"
REPLAYED_KEY = "a2agw.replayed"
IDENTITY_KEYS = frozenset({"a2agw.peer", "a2agw.identity", "a2agw.spiffe_id", "a2agw.caller"})
"""Metadata keys that would name the caller: refused, whatever their value (UNAUTHENTICATED)."""
JSON_MEDIA_TYPE = "application/json"
_GATEWAY_PREFIX = "a2agw."
CONTEXT_ID_RULE = "context_id must be empty or 1-128 characters of [A-Za-z0-9._:-]"
"""The problem a malformed ``context_id`` is refused with (SendMessage and ListTasks)."""
MAX_LIST_BYTES = MAX_PAYLOAD_CEILING
"""Most bytes of tasks in one ListTasks answer (the gRPC message ceiling less the envelope's)."""
_FIELD_OVERHEAD = 16  # a repeated field's tag and length, generously
MAX_METADATA_KEYS = 256
"""Most keys a request's and its message's metadata may hold together. Each key is read
(``a2agw.*`` values checked, identity claims looked for); a peer granted a few bytes of payload
could otherwise send a 4 MiB map of 270,000 keys and hold the event loop for it."""


class _Problem(Exception):
    """Why a SendMessage cannot become a call (becomes ``InvokeCall.problem``)."""


def invoke_call(
    request: a2a_pb2.SendMessageRequest,
    *,
    peer_cert_pem: bytes | None,
    deadline: float,
    task_id: str,
    default_capability: str = "",
    tokens: PresentedTokens | None = None,
) -> InvokeCall:
    """The call a SendMessage asks for; ``problem`` says why it is not one.

    Nothing here grows with the size of a ``data`` part: it is measured, not
    converted (see the module doc). ``default_capability`` (``NAME[@CONSTRAINT]``,
    "" for none) is called when the message names no capability. ``tokens``:
    the bearer tokens the request presented (its headers, not its metadata).
    """
    message = request.message
    capability = constraint = idempotency_key = problem = ""
    payload = b""
    pending: DataPart | TextPart | None = None
    try:
        _check_envelope(request)
        _check_gateway_metadata(message)
        capability, constraint = _capability(message, default_capability)
        idempotency_key = _text_metadata(message, IDEMPOTENCY_KEY)
        payload, pending = _payload(message)
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
        claimed_identity=claimed_identity(request.metadata, message.metadata),
        pending_payload=pending,
        tokens=tokens,
    )


def claimed_identity(*metadata: struct_pb2.Struct) -> str:
    """The first :data:`IDENTITY_KEYS` key any of ``metadata`` holds ("" if none)."""
    for struct in metadata:  # looked up, not scanned: the map may be large
        claimed = sorted(key for key in IDENTITY_KEYS if key in struct.fields)
        if claimed:
            return claimed[0]
    return ""


def _check_envelope(request: a2a_pb2.SendMessageRequest) -> None:
    if request.tenant:
        raise _Problem("tenants are not supported by this agent; send an empty tenant")
    if not request.HasField("message"):
        raise _Problem("SendMessageRequest.message is missing")
    if request.message.task_id:
        raise _Problem("every message starts a new task here; send it without task_id")
    if request.message.context_id and not REQUEST_ID.fullmatch(request.message.context_id):
        raise _Problem(CONTEXT_ID_RULE)
    keys = len(request.metadata.fields) + len(request.message.metadata.fields)
    if keys > MAX_METADATA_KEYS:
        raise _Problem(f"metadata holds {keys} keys; at most {MAX_METADATA_KEYS} are read")


def _check_gateway_metadata(message: a2a_pb2.Message) -> None:
    for key, value in message.metadata.fields.items():
        if key in IDENTITY_KEYS:  # refused for what it claims, whatever its value
            continue
        if key.startswith(_GATEWAY_PREFIX) and value.WhichOneof("kind") != "string_value":
            raise _Problem(f"message metadata '{printable(key[:64])}' must be a string")


def _capability(message: a2a_pb2.Message, default: str) -> tuple[str, str]:
    # Never stripped: "kv.put\n" must meet the same refusal as over Invoke.
    named = CAPABILITY_KEY in message.metadata.fields
    text = _text_metadata(message, CAPABILITY_KEY) if named else default
    if not text:
        raise _Problem(f"message metadata {CAPABILITY_KEY!r} (NAME[@CONSTRAINT]) is missing")
    name, _, constraint = text.partition("@")
    if not name:
        raise _Problem(f"message metadata {CAPABILITY_KEY!r} names no capability")
    return name, constraint


def _text_metadata(message: a2a_pb2.Message, key: str) -> str:
    value = message.metadata.fields.get(key)
    return "" if value is None else str(value.string_value)  # a string: checked before


def _payload(message: a2a_pb2.Message) -> tuple[bytes, DataPart | TextPart | None]:
    if len(message.parts) != 1:
        raise _Problem(f"the message must have exactly one part, it has {len(message.parts)}")
    part = message.parts[0]
    kind = part.WhichOneof("content")
    if kind == "raw":
        if part.media_type != JSON_MEDIA_TYPE:
            raise _Problem(f"a raw part must have media_type {JSON_MEDIA_TYPE!r}")
        return bytes(part.raw), None
    if kind == "data":
        if part.data.WhichOneof("kind") != "struct_value":
            raise _Problem("a data part must hold a JSON object")
        return b"", DataPart(part.data)
    if kind == "text":
        return b"", TextPart(part.text)
    raise _Problem(f"a {kind or 'empty'} part cannot carry a payload; send data, text or raw JSON")


def task_message(task: A2ATask, *, include_artifacts: bool = True) -> a2a_pb2.Task:
    """The A2A ``Task`` for a stored task (SendMessage, GetTask, ListTasks, CancelTask)."""
    answer = a2a_pb2.Task()
    fill_task(answer, task, include_artifacts=include_artifacts)
    return answer


def send_answer(task: A2ATask) -> a2a_pb2.SendMessageResponse:
    """The SendMessage answer holding ``task``, built where it is sent."""
    response = a2a_pb2.SendMessageResponse()
    fill_task(response.task, task)
    return response


def task_event(task: A2ATask) -> a2a_pb2.StreamResponse:
    """The stream event holding ``task`` (a stream's first event), built where it is sent."""
    event = a2a_pb2.StreamResponse()
    fill_task(event.task, task)
    return event


def fill_task(answer: a2a_pb2.Task, task: A2ATask, *, include_artifacts: bool = True) -> None:
    """Write ``task`` into the empty ``answer`` in place (see :func:`task_message`).

    In place because handing a built ``Task`` to a message constructor
    (``SendMessageResponse(task=...)``) merges it field by field: ~1 ms for a
    256 KB output here, against ~20 µs for ``CopyFrom`` and nothing at all
    for a task written where it is sent.
    """
    answer.id = task.task_id
    answer.context_id = task.context_id
    answer.status.timestamp.FromMilliseconds(task.updated_ms)
    answer.metadata.update({"a2agw.capability": task.capability})
    if task.served_version:
        answer.metadata[SERVED_VERSION_KEY] = task.served_version
    if task.state is not TaskOutcome.COMPLETED:
        _unfinished_or_failed(answer, task)
        return
    answer.status.state = a2a_pb2.TASK_STATE_COMPLETED
    if include_artifacts:
        fill_artifact(answer.artifacts.add(), task)  # in place: appending copies the output


_WIRE_STATES = {
    TaskOutcome.FAILED: a2a_pb2.TASK_STATE_FAILED,
    TaskOutcome.CANCELED: a2a_pb2.TASK_STATE_CANCELED,
    TaskOutcome.SUBMITTED: a2a_pb2.TASK_STATE_SUBMITTED,
    TaskOutcome.WORKING: a2a_pb2.TASK_STATE_WORKING,
}


def _unfinished_or_failed(answer: a2a_pb2.Task, task: A2ATask) -> None:
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


def list_answer(page: TaskPage, *, include_artifacts: bool) -> a2a_pb2.ListTasksResponse:
    """The ListTasks answer for ``page``, cut short to fit one gRPC message.

    A page of large outputs can exceed what gRPC sends; the page then ends at
    the last task that fits and its token continues right after that task.
    """
    response = a2a_pb2.ListTasksResponse(total_size=page.total_size)
    answers = response.tasks  # each task written in place: passing built ones copies them
    used, token, size = 0, page.next_page_token, page.page_size
    for task in page.tasks:
        answer = answers.add()
        fill_task(answer, task, include_artifacts=include_artifacts)
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
    """Write a completed task's one artifact into the empty ``artifact`` in place."""
    # The output is decoded straight into the part's Value: every copy of a
    # message holding it (CopyFrom, append) copies the whole output again.
    artifact.artifact_id = f"{task.task_id}-output"
    artifact.name = task.capability
    part = artifact.parts.add(media_type=JSON_MEDIA_TYPE)
    _set_json(part.data, task.output)
    artifact.metadata.update(
        {
            SERVED_VERSION_KEY: task.served_version,
            EVIDENCE_KEY: task.evidence_sha256,
            REPLAYED_KEY: task.remembered,
        }
    )


def _set_json(value: struct_pb2.Value, payload: bytes) -> None:
    decoded = _decoded(payload)
    if isinstance(decoded, dict):
        value.struct_value.update(decoded)
    else:  # outputs are objects by contract; anything else still travels faithfully
        json_format.ParseDict(decoded, value)


def _decoded(payload: bytes) -> Any:
    if isinstance(payload, CanonicalJson):  # an output just run: its value, not a re-read
        return payload.value
    # orjson reads an integer beyond 64 bits as a float where json keeps an int;
    # a Value holds every number as a double, so the Value comes out the same.
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)  # what only json reads, e.g. NaN
