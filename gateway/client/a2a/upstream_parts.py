"""A2A parts sent to and read from an upstream agent (the SDK stays in the transport)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from a2a.types import Part
from pydantic import BaseModel

from gateway.transport.a2a.part_payloads import plain_json

_JSON = "application/json"


def text_part(text: str) -> Part:
    """One ``text`` part."""
    return Part(text=text)


def data_part(payload: BaseModel) -> Part:
    """One ``data`` part holding the fields of ``payload`` the caller set."""
    # Only what the caller set of the declared fields: nothing else leaves.
    part = Part(media_type=_JSON)
    part.data.struct_value.update(payload.model_dump(mode="json", exclude_unset=True))
    return part


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
