"""What a message carries and what a capability may answer with, beyond one JSON object.

Parts are the A2A part kinds as plain frozen values (no wire types):

* :class:`TextPart`: text, with a media type (``text/plain`` unless said);
* :class:`DataPart`: a JSON value (an object, when it is a reply's);
* :class:`FilePart`: bytes with a media type and an optional name;
* :class:`UrlPart`: a reference to content elsewhere. The gateway never fetches it.

A capability receives every part of the message that called it on ``ctx.parts``
and may answer, instead of its output object, with a :class:`TaskReply` (a
task holding several :class:`Artifact` of any part kind, and an optional final
status text) or a :class:`MessageReply` (the A2A answer is a Message; no task
is kept). What it accepts and gives is declared in its contract
(:class:`~capabilities.contract.Accepts`, :class:`~capabilities.contract.Gives`);
:mod:`capabilities.replies` holds the one canonical JSON form of a reply.

Every value checks itself when it is made, so a malformed part fails where
it is built (inside a capability: ``CAPABILITY_FAILED``), never on the wire.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from capabilities.media_types import check_media_type

MAX_NAME_CHARS = 255
"""Longest file, artifact or part name."""
MAX_URL_CHARS = 8192
"""Longest URL a part may carry."""


@dataclass(frozen=True, slots=True)
class TextPart:
    """A text part.

    Attributes:
        text: The text.
        media_type: Its media type (``text/plain`` unless said, e.g. ``text/markdown``).
    """

    text: str
    media_type: str = "text/plain"

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError("TextPart.text must be a str")
        check_media_type(self.media_type, "TextPart.media_type")


@dataclass(frozen=True, slots=True)
class DataPart:
    """A structured part: a JSON value (a reply's data parts: JSON objects).

    Attributes:
        data: The value, made of dict (string keys), list, str, int, float,
            bool and None. Numbers that reached the gateway as an A2A ``data``
            part are doubles, except in the part that became the input, whose
            whole numbers are integers where its schema says so.
    """

    data: Any


@dataclass(frozen=True, slots=True)
class FilePart:
    """A file carried in the message: bytes with a media type.

    Attributes:
        data: The file's bytes.
        media_type: Its media type, e.g. ``text/plain`` or ``image/png``.
        name: Its file name ("" if none), e.g. ``report.pdf``.
    """

    data: bytes
    media_type: str
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError("FilePart.data must be bytes")
        check_media_type(self.media_type, "FilePart.media_type")
        _check_name(self.name, "FilePart.name")


@dataclass(frozen=True, slots=True)
class UrlPart:
    """A file by reference. The gateway passes the URL on and never fetches it.

    Attributes:
        url: Where the content is (any scheme; no control characters).
        media_type: Its media type, if known ("" otherwise).
        name: Its file name, if known.
    """

    url: str
    media_type: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not 0 < len(self.url) <= MAX_URL_CHARS:
            raise ValueError(f"UrlPart.url must be a str of 1-{MAX_URL_CHARS} characters")
        if not self.url.isprintable() or any(c.isspace() for c in self.url):
            raise ValueError("UrlPart.url must hold no whitespace or control characters")
        if self.media_type:
            check_media_type(self.media_type, "UrlPart.media_type")
        _check_name(self.name, "UrlPart.name")


Part = TextPart | DataPart | FilePart | UrlPart
"""Any part a message carries or a reply holds."""
PART_TYPES = (TextPart, DataPart, FilePart, UrlPart)


@dataclass(frozen=True, slots=True)
class Artifact:
    """One output of a task: one or more parts.

    Attributes:
        parts: Its parts, in order (a list is kept as a tuple).
        name: A name for it ("" if none).
        description: What it is ("" if nothing to say).
    """

    parts: tuple[Part, ...]
    name: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", _parts(self.parts, "Artifact.parts"))
        _check_name(self.name, "Artifact.name")
        if not isinstance(self.description, str):
            raise TypeError("Artifact.description must be a str")


@dataclass(frozen=True, slots=True)
class TaskReply:
    """Answer with a task holding these artifacts (instead of one output object).

    Attributes:
        artifacts: The task's artifacts, in order (none is allowed).
        text: The final status message's text ("" for none).
    """

    artifacts: tuple[Artifact, ...] = ()
    text: str = ""

    def __post_init__(self) -> None:
        artifacts = tuple(self.artifacts)
        if not all(isinstance(artifact, Artifact) for artifact in artifacts):
            raise TypeError("TaskReply.artifacts must hold Artifact values")
        object.__setattr__(self, "artifacts", artifacts)
        if not isinstance(self.text, str):
            raise TypeError("TaskReply.text must be a str")


@dataclass(frozen=True, slots=True)
class MessageReply:
    """Answer with a Message: no task is kept (A2A's direct answer).

    Attributes:
        parts: The message's parts (at least one).
    """

    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", _parts(self.parts, "MessageReply.parts"))


Reply = TaskReply | MessageReply
"""What a capability may return instead of its output object."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The caller's answer to ``ctx.ask_input`` asked without a schema: its whole message.

    Attributes:
        message_id: The answering message's id.
        parts: Its parts, as on ``ctx.parts``.
    """

    message_id: str
    parts: tuple[Part, ...] = field(default=())

    @property
    def text(self) -> str:
        """The text parts' texts joined with newlines ("" if it has none)."""
        return "\n".join(part.text for part in self.parts if isinstance(part, TextPart))


class AnyObject(BaseModel):
    """Any JSON object: the input or output model of a capability that takes or gives
    free-form data parts (declare it as the input type, or return only replies)."""

    model_config = ConfigDict(extra="allow", frozen=True)


def _parts(parts: Iterable[Part], what: str) -> tuple[Part, ...]:
    kept = tuple(parts)
    if not kept:
        raise ValueError(f"{what} must hold at least one part")
    if not all(isinstance(part, PART_TYPES) for part in kept):
        raise TypeError(f"{what} must hold TextPart, DataPart, FilePart or UrlPart values")
    return kept


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise ValueError(f"{what} must be a printable str of at most {MAX_NAME_CHARS} characters")
