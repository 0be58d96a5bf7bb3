"""A2A messages → the protocol-neutral call (stored tasks → A2A: ``task_view``).

A SendMessage becomes one :class:`~gateway.inbound.call.InvokeCall`:

* capability: message metadata ``a2agw.capability`` = ``NAME[@CONSTRAINT]``,
  passed on exactly as sent (never stripped: the pipeline refuses what Invoke
  refuses); without it, the agent's ``[a2a] default_capability`` if set. A
  message that continues a task (:class:`FollowUp`) calls the task's
  capability at the version that serves it; ``a2agw.capability`` may only
  name that one (and a constraint that admits that version);
* request id: ``message_id`` (replay protection, as ``request_id`` for Invoke);
* idempotency key: message metadata ``a2agw.idempotency_key`` (optional; not on
  a follow-up: the key belongs to the message that starts the run);
* payload: the message's parts (:class:`~gateway.transport.a2a.part_payloads.MessageParts`),
  measured here, checked against the chosen version's ``accepts`` and decoded
  by the pipeline once every check up to the cap has passed; a lone ``raw``
  part of media type ``application/json`` is the payload itself, unchanged (the
  payload cap and the digest apply to those bytes).

Metadata (the message's or the request's) that claims who is calling
(:data:`IDENTITY_KEYS`) becomes ``InvokeCall.claimed_identity``, refused
UNAUTHENTICATED: only the TLS handshake names the caller.

Every other ``a2agw.*`` metadata value must be a string, and ``context_id`` an
id (empty, or 1-128 of ``[A-Za-z0-9._:-]``; on a follow-up, empty or the
task's: spec 3.4.3). Anything else becomes ``InvokeCall.problem``, which the
pipeline answers with INVALID_REQUEST once it knows who is asking. Problems
never quote payload content.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.types import a2a_pb2
from google.protobuf import struct_pb2
from pydantic import BaseModel

from capabilities.versions import Version, VersionConstraint, VersionSyntaxError
from gateway.display import printable
from gateway.identity import PresentedTokens
from gateway.inbound.call import REQUEST_ID, InvokeCall
from gateway.transport.a2a.part_payloads import MessageParts, lone_json

CAPABILITY_KEY = "a2agw.capability"
"""Message metadata key naming the capability: ``NAME`` or ``NAME@CONSTRAINT``."""
IDEMPOTENCY_KEY = "a2agw.idempotency_key"
"""Message metadata key of the idempotency key (write capabilities run once per key)."""
IDENTITY_KEYS = frozenset({"a2agw.peer", "a2agw.identity", "a2agw.spiffe_id", "a2agw.caller"})
"""Metadata keys that would name the caller: refused, whatever their value (UNAUTHENTICATED)."""
_GATEWAY_PREFIX = "a2agw."
CONTEXT_ID_RULE = "context_id must be empty or 1-128 characters of [A-Za-z0-9._:-]"
"""The problem a malformed ``context_id`` is refused with (SendMessage and ListTasks)."""
MAX_METADATA_KEYS = 256
"""Most keys a request's and its message's metadata may hold together. Each key is read
(``a2agw.*`` values checked, identity claims looked for); a peer granted a few bytes of payload
could otherwise send a 4 MiB map of 270,000 keys and hold the event loop for it."""


class _Problem(Exception):
    """Why a SendMessage cannot become a call (becomes ``InvokeCall.problem``)."""


@dataclass(frozen=True, slots=True)
class FollowUp:
    """The task a message continues: what it is checked and run against.

    Attributes:
        capability: The task's capability.
        served_version: The version running it.
        context_id: The task's context.
        answers: The model the message's content is validated against (the
            schema ``ctx.ask_input`` asked with, or ``AnyObject``).
    """

    capability: str
    served_version: str
    context_id: str
    answers: type[BaseModel]


def invoke_call(
    request: a2a_pb2.SendMessageRequest,
    *,
    peer_cert_pem: bytes | None,
    deadline: float,
    task_id: str,
    default_capability: str = "",
    context_id: str = "",
    follow_up: FollowUp | None = None,
    tokens: PresentedTokens | None = None,
) -> InvokeCall:
    """The call a SendMessage asks for; ``problem`` says why it is not one.

    Nothing here grows with the size of a part: it is measured, not converted
    (see the module doc). ``default_capability`` (``NAME[@CONSTRAINT]``, ""
    for none) is called when the message names no capability; ``context_id``
    is the one the task gets. ``follow_up``: the task the message continues
    (``task_id`` is then that task's id). ``tokens``: the bearer tokens the
    request presented (its headers, not its metadata).
    """
    message = request.message
    capability = constraint = idempotency_key = problem = ""
    payload = b""
    json_bytes = False  # a lone application/json raw part: its bytes are the payload, even b""
    parts: MessageParts | None = None
    try:
        _check_envelope(request, follow_up)
        _check_gateway_metadata(message)
        if follow_up is None:
            capability, constraint = _capability(message, default_capability)
        else:
            capability, constraint = _follow_up_capability(message, follow_up)
        idempotency_key = _text_metadata(message, IDEMPOTENCY_KEY)
        if idempotency_key and follow_up is not None:
            raise _Problem(
                f"{IDEMPOTENCY_KEY} belongs to the message that starts a task, not a follow-up"
            )
        if not message.parts:
            raise _Problem("the message has no parts")
        if lone_json(message.parts):
            payload = bytes(message.parts[0].raw)
            json_bytes = True
        parts = MessageParts(
            message.parts,
            follow_up.context_id if follow_up is not None else context_id,
            follow_up.answers if follow_up is not None else None,
        )
    except _Problem as err:  # nothing of the parts is measured: refused before the cap
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
        pending_payload=None if json_bytes else parts,
        message=parts,
        tokens=tokens,
    )


def claimed_identity(*metadata: struct_pb2.Struct) -> str:
    """The first :data:`IDENTITY_KEYS` key any of ``metadata`` holds ("" if none)."""
    for struct in metadata:  # looked up, not scanned: the map may be large
        claimed = sorted(key for key in IDENTITY_KEYS if key in struct.fields)
        if claimed:
            return claimed[0]
    return ""


def _check_envelope(request: a2a_pb2.SendMessageRequest, follow_up: FollowUp | None) -> None:
    if request.tenant:
        raise _Problem("tenants are not supported by this agent; send an empty tenant")
    if not request.HasField("message"):
        raise _Problem("SendMessageRequest.message is missing")
    message = request.message
    if message.task_id and follow_up is None:  # the servicer looks tasks up first
        raise _Problem("this message names a task that cannot be continued here")
    if message.context_id and not REQUEST_ID.fullmatch(message.context_id):
        raise _Problem(CONTEXT_ID_RULE)
    if follow_up is not None and message.context_id not in ("", follow_up.context_id):
        raise _Problem("context_id differs from the task's; send the task's or none")
    configuration = request.configuration
    if follow_up is not None and configuration.HasField("task_push_notification_config"):
        raise _Problem(
            "a message continuing a task sets no push config; use CreateTaskPushNotificationConfig"
        )
    if configuration.HasField("history_length") and configuration.history_length < 0:
        raise _Problem("history_length must not be negative")
    keys = len(request.metadata.fields) + len(message.metadata.fields)
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


def _follow_up_capability(message: a2a_pb2.Message, follow_up: FollowUp) -> tuple[str, str]:
    """The task's capability at its served version; a named one must be the same."""
    exact = f"={follow_up.served_version}"
    if CAPABILITY_KEY not in message.metadata.fields:
        return follow_up.capability, exact
    name, _, constraint = _text_metadata(message, CAPABILITY_KEY).partition("@")
    if name != follow_up.capability:
        raise _Problem(f"message metadata {CAPABILITY_KEY!r} must name the task's capability")
    try:
        allowed = VersionConstraint.parse(constraint).allows(
            Version.parse(follow_up.served_version)
        )
    except (VersionSyntaxError, ValueError):
        allowed = False
    if not allowed:
        raise _Problem(
            f"message metadata {CAPABILITY_KEY!r} must admit the task's version "
            f"{follow_up.served_version}"
        )
    return follow_up.capability, exact


def _text_metadata(message: a2a_pb2.Message, key: str) -> str:
    value = message.metadata.fields.get(key)
    return "" if value is None else str(value.string_value)  # a string: checked before
