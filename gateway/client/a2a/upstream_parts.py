"""A2A parts sent to and read from an upstream agent (the SDK stays in the transport).

A caller's parts (``capabilities.parts``) are written into the upstream
message as they are (:func:`fill_wire_part`); the upstream's parts are read
back into them (:func:`typed_parts`), each checked as a capability's reply
part is when it is made: a part with no content, a malformed media type,
file name or URL, or a data part holding a number JSON cannot carry makes the
answer unreadable (``UnreadableAnswer``: INVALID_OUTPUT), and so do more than
``MAX_ANSWER_PARTS`` parts. Their bytes are bounded before they are read (the
answer's ceiling) and, as a reply, by the caller's output cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from a2a.types import Part
from google.protobuf import json_format
from pydantic import BaseModel

from capabilities import parts as typed
from capabilities.media_types import OCTET_STREAM
from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.transport.a2a.part_payloads import plain_json

_JSON = "application/json"
MAX_ANSWER_PARTS = 1024
"""Most parts one answer of an upstream may hold (its message's, or its task's in all)."""


def text_part(text: str) -> Part:
    """One ``text`` part."""
    return Part(text=text)


def data_part(payload: BaseModel) -> Part:
    """One ``data`` part holding the fields of ``payload`` the caller set."""
    # Only what the caller set of the declared fields: nothing else leaves.
    part = Part(media_type=_JSON)
    part.data.struct_value.update(payload.model_dump(mode="json", exclude_unset=True))
    return part


def fill_wire_part(target: Part, part: typed.Part) -> None:
    """Write ``part`` into the empty wire part ``target`` (built in place: no merge)."""
    if isinstance(part, typed.TextPart):
        target.text = part.text
        if part.media_type != "text/plain":
            target.media_type = part.media_type
    elif isinstance(part, typed.DataPart):
        target.media_type = _JSON
        if isinstance(part.data, dict):
            target.data.struct_value.update(part.data)
        else:
            json_format.ParseDict(part.data, target.data)
    elif isinstance(part, typed.FilePart):
        target.raw = part.data
        target.media_type = part.media_type
        if part.name:
            target.filename = part.name
    else:
        target.url = part.url
        if part.media_type:
            target.media_type = part.media_type
        if part.name:
            target.filename = part.name


def typed_parts(parts: Iterable[Part]) -> tuple[typed.Part, ...]:
    """The upstream's ``parts``, each read and checked (see the module doc).

    Raises:
        UnreadableAnswer: a part is malformed.
    """
    return tuple(_typed(part) for part in parts)


def _typed(part: Part) -> typed.Part:
    kind = part.WhichOneof("content")
    try:
        if kind == "text":
            return typed.TextPart(part.text, part.media_type or "text/plain")
        if kind == "data":
            return typed.DataPart(plain_json(part.data))
        if kind == "raw":
            return typed.FilePart(bytes(part.raw), part.media_type or OCTET_STREAM, part.filename)
        if kind == "url":
            return typed.UrlPart(part.url, part.media_type, part.filename)
    except (ValueError, TypeError) as err:  # never quoted: it is the upstream's content
        raise UnreadableAnswer(f"a {kind} part of the upstream's answer is malformed") from err
    raise UnreadableAnswer("a part of the upstream's answer holds no content")


def joined_text(parts: Sequence[Part]) -> dict[str, Any] | None:
    """``{"text": ...}``: the text parts joined; None when there is none."""
    texts = [part.text for part in parts if part.WhichOneof("content") == "text"]
    return {"text": "".join(texts)} if texts else None


def first_data(parts: Sequence[Part]) -> Any:
    """The first ``data`` part as plain JSON values; None when there is none, or when it
    holds a number JSON cannot carry (NaN, infinity): no output, so INVALID_OUTPUT."""
    for part in parts:
        if part.WhichOneof("content") == "data":
            try:
                return plain_json(part.data)
            except ValueError:
                return None
    return None
