"""An A2A message's parts as a pending payload: measured at once, checked and decoded if admitted.

Converting a ``Struct`` to JSON costs CPU that grows with the part, so the parts
are first only measured (``size``, what the payload cap counts: each part's
content, a data part's serialized ``Value``, a text's UTF-8 bytes, a file's
bytes, a URL's characters, plus its file name, media type and metadata). Only
once every check up to the cap has passed are they checked against the chosen
version's ``accepts`` (:meth:`MessageParts.check_parts`) and decoded
(:meth:`MessageParts.decode`), and the JSON input they become must be within
the cap too.

The input a message becomes (for the input model, or the schema a follow-up
answers):

* its first ``data`` part, which must hold a JSON object (whole numbers made
  integers where the schema says ``integer``: a ``Value`` carries doubles);
* else, for a model that is exactly one string field ``text``, the message's
  text parts joined with newlines, as ``{"text": ...}``;
* else ``{}`` (the model decides whether that is an input).

A lone ``raw`` part of media type ``application/json`` is not pending at all:
its bytes are the JSON input, unchanged (``gateway.server.a2a.messages``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from google.protobuf import struct_pb2
from pydantic import BaseModel

from capabilities.canonical import canonical_json
from capabilities.contract import Accepts
from capabilities.media_types import OCTET_STREAM, essence, matches
from capabilities.parts import (
    MAX_NAME_CHARS,
    MAX_URL_CHARS,
    DataPart,
    FilePart,
    Part,
    TextPart,
    UrlPart,
)
from gateway.display import printable
from gateway.errors import ContentTypeNotSupported, InvalidInput, InvalidRequest
from gateway.transport.a2a.json_numbers import restore_integers

JSON_MEDIA_TYPE = "application/json"
_TEXT_INPUT = {"text": "string"}


class WirePart(Protocol):
    """What is read of an ``lf.a2a.v1.Part`` (the SDK's types stay at the A2A edges)."""

    text: str
    raw: bytes
    url: str
    filename: str
    media_type: str

    @property
    def data(self) -> struct_pb2.Value:
        """The ``data`` content."""
        ...

    @property
    def metadata(self) -> struct_pb2.Struct:
        """The part's metadata."""
        ...

    def WhichOneof(self, oneof_group: Any) -> Any:
        """Which content the part holds: ``text``, ``raw``, ``url``, ``data`` or None."""
        ...

    def HasField(self, field_name: Any) -> bool:
        """Whether a message field is set."""
        ...


class MessageParts:
    """The parts of one A2A message: its pending payload, and what ``ctx.parts`` shows.

    Attributes:
        size: What the payload cap counts (see the module doc), measured once.
        context_id: The message's context (the task's, for a follow-up).
        answers: For a follow-up answering ``ctx.ask_input``, the model its
            content is validated against (None: the chosen version's input model).
    """

    __slots__ = ("_data", "_parts", "_payload", "_typed_parts", "answers", "context_id", "size")

    def __init__(
        self,
        parts: Sequence[WirePart],
        context_id: str = "",
        answers: type[BaseModel] | None = None,
    ) -> None:
        self._parts = parts
        self.context_id = context_id
        self.answers = answers
        self.size = sum(_measured(part) for part in parts)
        self._data: dict[int, Any] = {}  # part index -> its JSON, once decoded
        self._payload = -1  # the index of the data part that became the input
        self._typed_parts: tuple[Part, ...] | None = None

    def check_parts(self, accepts: Accepts, input_model: type[BaseModel]) -> None:
        """Refuse a message the contract does not take (nothing decoded yet).

        Raises:
            InvalidRequest: more parts than it takes, an empty part, a malformed
                media type, file name or URL.
            ContentTypeNotSupported: a part of a kind or media type it does not take.
            InvalidInput: text for a contract that takes neither text nor a
                ``{"text": ...}`` input (named as before this check existed).
        """
        parts = self._parts
        if len(parts) == 1 and accepts.data:  # the common message: one plain data part
            only = parts[0]
            if only.WhichOneof("content") == "data" and not (only.media_type or only.filename):
                return
        if len(parts) > accepts.max_parts:
            raise InvalidRequest(
                f"the message has {len(parts)} parts; this capability takes at most "
                f"{accepts.max_parts}"
            )
        for part in parts:
            _check_form(part)
            kind = part.WhichOneof("content")
            if (kind == "data" or lone_json(parts)) and not accepts.data:
                raise _unsupported("data parts", accepts)
            if kind == "text" and not (accepts.text or _input_fields(input_model) == _TEXT_INPUT):
                if lone_json(parts) or any(p.WhichOneof("content") == "data" for p in parts):
                    raise _unsupported("text parts", accepts)
                raise _text_refusal(input_model)
            if kind == "url" and not accepts.urls:
                raise _unsupported("URL parts", accepts)
            if kind == "raw" and not (
                matches(accepts.files, part.media_type or OCTET_STREAM) or lone_json(parts)
            ):
                shown = printable(part.media_type[:64]) or OCTET_STREAM
                raise _unsupported(f"file parts of media type {shown!r}", accepts)

    def decode(self, input_model: type[BaseModel]) -> bytes:
        """The input's JSON bytes (compact, sorted keys) for ``input_model``.

        Every data part is converted here (once), so ``parts`` never fails later.

        Raises:
            InvalidRequest: the input's data part is no JSON object, or a data
                part holds a number JSON cannot carry (NaN, infinity).
        """
        payload: Any = {}
        for index, part in enumerate(self._parts):
            if part.WhichOneof("content") != "data":
                continue
            try:
                if self._payload < 0:
                    if part.data.WhichOneof("kind") != "struct_value":
                        raise InvalidRequest("a data part must hold a JSON object")
                    payload = restore_integers(plain_json(part.data), [input_model])
                    self._payload = index
                    self._data[index] = payload
                else:
                    self._data[index] = plain_json(part.data)
            except ValueError as err:
                raise InvalidRequest("the data part holds a number JSON cannot carry") from err
        if self._payload < 0 and _input_fields(input_model) == _TEXT_INPUT:
            texts = [part.text for part in self._parts if part.WhichOneof("content") == "text"]
            if texts:
                payload = {"text": "\n".join(texts)}
        return canonical_json(payload, allow_nan=False)

    def parts(self) -> tuple[Part, ...]:
        """Every part, typed (after :meth:`check_parts` and :meth:`decode` passed), built
        when first asked for."""
        if self._typed_parts is None:
            self._typed_parts = tuple(self._typed(n, part) for n, part in enumerate(self._parts))
        return self._typed_parts

    def _typed(self, index: int, part: WirePart) -> Part:
        kind = part.WhichOneof("content")
        if kind == "text":
            return TextPart(part.text, part.media_type or "text/plain")
        if kind == "data":
            data = self._data[index] if index in self._data else plain_json(part.data)
            return DataPart(data)
        if kind == "raw":
            return FilePart(bytes(part.raw), part.media_type or OCTET_STREAM, part.filename)
        return UrlPart(part.url, part.media_type, part.filename)


def lone_json(parts: Sequence[WirePart]) -> bool:
    """True for a message of one ``raw`` part of media type ``application/json``."""
    return (
        len(parts) == 1
        and parts[0].WhichOneof("content") == "raw"
        and parts[0].media_type == JSON_MEDIA_TYPE
    )


def _measured(part: WirePart) -> int:
    kind = part.WhichOneof("content")
    if kind == "data":
        size = int(part.data.ByteSize())
    elif kind == "text":
        size = len(part.text.encode())
    elif kind == "raw":
        size = len(part.raw)
    else:
        size = len(part.url.encode())
    if part.filename:
        size += len(part.filename.encode())
    if part.media_type:
        size += len(part.media_type.encode())
    if part.HasField("metadata"):
        size += int(part.metadata.ByteSize())
    return size


def _check_form(part: WirePart) -> None:
    """What every part must be, whatever the contract (never quoting it)."""
    kind = part.WhichOneof("content")
    if kind is None:
        raise InvalidRequest("a part holds no content (text, raw, url or data)")
    if part.media_type and essence(part.media_type) is None:
        raise InvalidRequest("a part's media_type is not a media type such as 'text/plain'")
    name = part.filename
    if name and (len(name) > MAX_NAME_CHARS or not name.isprintable()):
        raise InvalidRequest(
            f"a part's filename must be printable and at most {MAX_NAME_CHARS} characters"
        )
    if kind == "url":
        url = part.url
        if not url or len(url) > MAX_URL_CHARS or not url.isprintable() or " " in url:
            raise InvalidRequest(
                f"a url part must hold 1-{MAX_URL_CHARS} characters without whitespace"
            )


def _unsupported(what: str, accepts: Accepts) -> ContentTypeNotSupported:
    return ContentTypeNotSupported(
        f"{what} are not accepted by this capability (it takes: {accepts.describe()})"
    )


def _text_refusal(model: type[BaseModel]) -> InvalidInput:
    declared = ", ".join(sorted(_input_fields(model))[:8]) or "none"
    return InvalidInput(
        'a text part is the input {"text": ...} only of a capability whose input is '
        f"exactly one string field 'text'; this one's fields are: {declared}; "
        "send a data part"
    )


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
