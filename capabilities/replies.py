"""The one canonical JSON form of a capability's answer, and its check against the contract.

An output object is its own JSON, as always. A :class:`~capabilities.parts.TaskReply`
or :class:`~capabilities.parts.MessageReply` is a JSON object tagged with the key
:data:`REPLY_KEY` (never a field name of an output model: a Python identifier
holds no dot; an output object holding it is refused)::

    {"a2agw.reply": "task", "text": "done",
     "artifacts": [{"name": "report", "description": "", "parts": [
         {"kind": "text", "text": "...", "media_type": "text/plain"},
         {"kind": "data", "data": {...}},
         {"kind": "file", "bytes": "<base64>", "media_type": "text/csv", "name": "out.csv"},
         {"kind": "url", "url": "https://...", "media_type": "", "name": ""}]}]}
    {"a2agw.reply": "message", "parts": [...]}

Its canonical bytes (:func:`capabilities.canonical.canonical_json`) are what the
evidence digest covers, what the caller's output cap counts, what the
idempotency store and the A2A task store keep, and what ``a2agw.v1.Invoke``
answers as its output; the A2A bindings turn them into artifacts or a Message.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from capabilities.contract import Gives
from capabilities.media_types import OCTET_STREAM, matches
from capabilities.parts import (
    Artifact,
    DataPart,
    FilePart,
    MessageReply,
    Part,
    Reply,
    TaskReply,
    TextPart,
    UrlPart,
)

REPLY_KEY = "a2agw.reply"
"""The key that tags a reply's canonical JSON (``task`` or ``message``)."""
_MESSAGE_PREFIX = b'{"a2agw.reply":"message"'
"""How a MessageReply's canonical bytes start: its tag sorts before every other key."""

DataCheck = Callable[[Any], dict[str, Any]]
"""Validates a reply's data part against the output model; returns the JSON it becomes."""


def part_json(part: Part) -> dict[str, Any]:
    """The canonical JSON object of one part."""
    if isinstance(part, TextPart):
        return {"kind": "text", "text": part.text, "media_type": part.media_type}
    if isinstance(part, DataPart):
        return {"kind": "data", "data": part.data}
    if isinstance(part, FilePart):
        encoded = base64.b64encode(part.data).decode("ascii")
        return {"kind": "file", "bytes": encoded, "media_type": part.media_type, "name": part.name}
    return {"kind": "url", "url": part.url, "media_type": part.media_type, "name": part.name}


def part_from_json(value: Any) -> Part:
    """The part :func:`part_json` made ``value`` from.

    Raises:
        ValueError: ``value`` is no part's canonical JSON.
    """
    if not isinstance(value, dict):
        raise ValueError("a part is a JSON object")
    kind = value.get("kind")
    if kind == "text":
        return TextPart(_str(value, "text"), _str(value, "media_type"))
    if kind == "data":
        return DataPart(value.get("data"))
    if kind == "file":
        try:
            data = base64.b64decode(_str(value, "bytes"), validate=True)
        except binascii.Error as err:
            raise ValueError("a file part's bytes are not base64") from err
        return FilePart(data, _str(value, "media_type"), _str(value, "name"))
    if kind == "url":
        return UrlPart(_str(value, "url"), _str(value, "media_type"), _str(value, "name"))
    raise ValueError("a part's kind is text, data, file or url")


def reply_json(reply: Reply) -> dict[str, Any]:
    """The canonical JSON object of ``reply`` (see the module doc)."""
    if isinstance(reply, MessageReply):
        return {REPLY_KEY: "message", "parts": [part_json(part) for part in reply.parts]}
    return {
        REPLY_KEY: "task",
        "text": reply.text,
        "artifacts": [
            {
                "name": artifact.name,
                "description": artifact.description,
                "parts": [part_json(part) for part in artifact.parts],
            }
            for artifact in reply.artifacts
        ],
    }


def reply_from_json(value: dict[str, Any]) -> Reply | None:
    """The reply a canonical JSON object holds; None for an output object.

    Raises:
        ValueError: it is tagged a reply but is not one's canonical JSON.
    """
    kind = value.get(REPLY_KEY)
    if kind is None:
        return None
    if kind == "message":
        return MessageReply(tuple(part_from_json(part) for part in _list(value, "parts")))
    if kind == "task":
        artifacts = tuple(
            Artifact(
                tuple(part_from_json(part) for part in _list(artifact, "parts")),
                _str(artifact, "name"),
                _str(artifact, "description"),
            )
            for artifact in _list(value, "artifacts")
        )
        return TaskReply(artifacts, _str(value, "text"))
    raise ValueError(f"{REPLY_KEY} is 'task' or 'message'")


def is_message_reply(payload: bytes) -> bool:
    """True if the canonical bytes ``payload`` are a MessageReply's (read without decoding:
    no output object holds the tag, so only a reply's bytes start with it)."""
    return payload.startswith(_MESSAGE_PREFIX)


def checked_reply(reply: Reply, gives: Gives, data_check: DataCheck) -> Reply:
    """``reply`` if the contract may give it, its data parts as ``data_check`` makes them.

    Raises:
        ValueError: it is an answer or holds a part the contract does not give
            (the message never quotes content); whatever ``data_check`` raises.
    """
    if isinstance(reply, MessageReply):
        if not gives.messages:
            raise ValueError("a MessageReply, and the contract gives no messages")
        return MessageReply(tuple(_checked_part(part, gives, data_check) for part in reply.parts))
    if not gives.tasks:
        raise ValueError("a TaskReply, and the contract gives messages only")
    artifacts = tuple(
        Artifact(
            tuple(_checked_part(part, gives, data_check) for part in artifact.parts),
            artifact.name,
            artifact.description,
        )
        for artifact in reply.artifacts
    )
    return TaskReply(artifacts, reply.text)


def _checked_part(part: Part, gives: Gives, data_check: DataCheck) -> Part:
    if isinstance(part, DataPart):
        if not gives.data:
            raise ValueError("a data part, and the contract gives none")
        return DataPart(data_check(part.data))
    if isinstance(part, TextPart):
        if not gives.text:
            raise ValueError("a text part, and the contract gives none")
    elif isinstance(part, FilePart):
        if not matches(gives.files, part.media_type or OCTET_STREAM):
            raise ValueError(f"a file part of media type {part.media_type[:64]!r}, not given")
    elif not gives.urls:
        raise ValueError("a URL part, and the contract gives none")
    return part


def _str(value: dict[str, Any], key: str) -> str:
    found = value.get(key, "")
    if not isinstance(found, str):
        raise ValueError(f"{key} is a string")
    return found


def _list(value: Any, key: str) -> list[Any]:
    found = value.get(key) if isinstance(value, dict) else None
    if not isinstance(found, list):
        raise ValueError(f"{key} is a list")
    return found
