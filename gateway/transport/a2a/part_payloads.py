"""A2A ``data`` and ``text`` parts as pending payloads: measured at once, decoded if admitted.

Converting a ``Struct`` to JSON costs CPU that grows with the part, so a part
is first only measured (``size``: the serialized size of a data part's
``Value``, a text part's UTF-8 bytes) for the payload cap; the pipeline decodes
it (``decode``) for the chosen version's input model only after every check up
to the cap has passed, and the JSON it becomes must be within the cap too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from google.protobuf import struct_pb2
from pydantic import BaseModel

from capabilities.canonical import canonical_json
from gateway.errors import InvalidInput, InvalidRequest
from gateway.transport.a2a.json_numbers import restore_integers


@dataclass(frozen=True, slots=True)
class DataPart:
    """A ``data`` part as a pending payload: measured now, converted to JSON only if admitted.

    Attributes:
        value: The part's ``Value`` (a Struct; checked by the caller).
        size: The serialized size of ``value``: what the payload cap counts
            first. Measured once, on construction: upb's ``ByteSize`` walks
            the whole message (~6 ms per MB, a twentieth of the conversion).
    """

    value: struct_pb2.Value
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", int(self.value.ByteSize()))

    def decode(self, input_model: type[BaseModel]) -> bytes:
        """Compact JSON with sorted keys; whole numbers made integers where the schema says.

        Raises:
            InvalidRequest: a number JSON cannot carry (NaN, infinity).
        """
        try:
            restored = restore_integers(plain_json(self.value), [input_model])
            return canonical_json(restored, allow_nan=False)
        except ValueError as err:
            raise InvalidRequest("the data part holds a number JSON cannot carry") from err


@dataclass(frozen=True, slots=True)
class TextPart:
    """A ``text`` part as a pending payload: ``{"text": ...}`` for a text-only input contract.

    Attributes:
        text: The part's text.
        size: The text's UTF-8 bytes: what the payload cap counts first.
    """

    text: str
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.text.encode()))

    def decode(self, input_model: type[BaseModel]) -> bytes:
        """``{"text": ...}`` as compact JSON, if the input is exactly one string field ``text``.

        Raises:
            InvalidInput: the chosen version's input is anything else (its
                declared field names are named, never the text).
        """
        fields = _input_fields(input_model)
        if fields != {"text": "string"}:
            declared = ", ".join(sorted(fields)[:8]) or "none"
            raise InvalidInput(
                'a text part is the input {"text": ...} only of a capability whose input is '
                f"exactly one string field 'text'; this one's fields are: {declared}; "
                "send a data part"
            )
        return canonical_json({"text": self.text}, allow_nan=False)


@lru_cache(maxsize=512)
def _input_fields(model: type[BaseModel]) -> dict[str, str]:
    """Top-level input field names and their JSON Schema types ("" when not one plain type)."""
    properties = model.model_json_schema().get("properties", {})
    return {name: str(schema.get("type", "")) for name, schema in properties.items()}


def plain_json(value: struct_pb2.Value) -> Any:
    """``value`` as plain JSON values, as ``json_format.MessageToDict`` makes them.

    Numbers stay floats (``restore_integers`` decides which are integers), an
    unset kind is ``None``. A direct walk over the fields: ``MessageToDict``
    looks up descriptors and dispatches per value, several times this cost.

    Raises:
        ValueError: a number JSON cannot carry (NaN, infinity).
    """
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "struct_value":
        return {key: plain_json(item) for key, item in value.struct_value.fields.items()}
    if kind == "number_value":
        number = value.number_value
        if math.isinf(number) or math.isnan(number):
            raise ValueError("a Value holds a number JSON cannot carry")
        return number
    if kind == "bool_value":
        return value.bool_value
    if kind == "list_value":
        return [plain_json(item) for item in value.list_value.values]
    return None
