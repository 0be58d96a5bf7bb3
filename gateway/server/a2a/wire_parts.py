"""Parts and messages in their canonical JSON form (:mod:`capabilities.replies`) ⇄ ``lf.a2a.v1``.

What the task store keeps of a reply, a status message or the history is
canonical JSON; the wire carries ``Part`` and ``Message`` protos. Both
directions are here: :func:`fill_part` writes a part's JSON into a proto part
(in place: a built part handed to a repeated field is copied), and
:func:`parts_json` reads typed parts into their JSON for keeping.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format, struct_pb2

from capabilities.parts import Part
from capabilities.replies import part_json

JSON_MEDIA_TYPE = "application/json"
_ROLES = {"user": a2a_pb2.ROLE_USER, "agent": a2a_pb2.ROLE_AGENT}


def parts_json(parts: Iterable[Part]) -> list[dict[str, Any]]:
    """The canonical JSON of ``parts``, for a status message or the history."""
    return [part_json(part) for part in parts]


def fill_part(part: a2a_pb2.Part, value: dict[str, Any]) -> None:
    """Write the part whose canonical JSON is ``value`` into the empty ``part``."""
    kind = value.get("kind")
    if kind == "text":
        part.text = value["text"]
        if value.get("media_type", "text/plain") != "text/plain":
            part.media_type = value["media_type"]
    elif kind == "data":
        part.media_type = JSON_MEDIA_TYPE
        set_json(part.data, value["data"])
    elif kind == "file":
        part.raw = base64.b64decode(value["bytes"])
        part.media_type = value["media_type"]
        if value.get("name"):
            part.filename = value["name"]
    else:
        part.url = value["url"]
        if value.get("media_type"):
            part.media_type = value["media_type"]
        if value.get("name"):
            part.filename = value["name"]


def set_json(target: struct_pb2.Value, data: Any) -> None:
    """``target`` = the JSON value ``data`` (an object straight into its struct: no copy)."""
    if isinstance(data, dict):
        target.struct_value.update(data)
    else:
        json_format.ParseDict(data, target)


def fill_message(
    message: a2a_pb2.Message,
    value: dict[str, Any],
    *,
    context_id: str,
    task_id: str = "",
    role: str = "agent",
) -> None:
    """Write a kept message (``{"message_id", "parts"[, "role"]}``) into the empty ``message``."""
    message.message_id = str(value.get("message_id") or uuid.uuid4())
    message.role = _ROLES.get(str(value.get("role", role)), a2a_pb2.ROLE_AGENT)
    message.context_id = context_id
    if task_id:
        message.task_id = task_id
    for part in value.get("parts", ()):
        fill_part(message.parts.add(), part)


def fill_messages(
    into: Any, values: Sequence[dict[str, Any]], *, context_id: str, task_id: str
) -> None:
    """Append each kept message of ``values`` to the repeated field ``into``."""
    for value in values:
        fill_message(into.add(), value, context_id=context_id, task_id=task_id)
