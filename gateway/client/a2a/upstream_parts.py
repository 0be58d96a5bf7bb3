"""A2A parts sent to and read from an upstream agent (the SDK stays in the transport)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from a2a.types import Part
from google.protobuf import json_format, struct_pb2
from pydantic import BaseModel

_JSON = "application/json"


def text_part(text: str) -> Part:
    """One ``text`` part."""
    return Part(text=text)


def data_part(payload: BaseModel) -> Part:
    """One ``data`` part holding the fields of ``payload`` the caller set."""
    # Only what the caller set of the declared fields: nothing else leaves.
    value = json_format.ParseDict(
        payload.model_dump(mode="json", exclude_unset=True), struct_pb2.Value()
    )
    return Part(data=value, media_type=_JSON)


def joined_text(parts: Sequence[Part]) -> dict[str, Any] | None:
    """``{"text": ...}``: the text parts joined; None when there is none."""
    texts = [part.text for part in parts if part.WhichOneof("content") == "text"]
    return {"text": "".join(texts)} if texts else None


def first_data(parts: Sequence[Part]) -> Any:
    """The first ``data`` part as plain JSON values; None when there is none."""
    for part in parts:
        if part.WhichOneof("content") == "data":
            return json_format.MessageToDict(part.data)
    return None
