"""What a capability promises: its typed contract."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from capabilities.media_types import check_pattern
from capabilities.parts import AnyObject
from capabilities.versions import Version

_NAME_SEGMENT = "abcdefghijklmnopqrstuvwxyz0123456789_-"


class Risk(StrEnum):
    """How much harm a capability can do, in increasing order."""

    READ = "read"
    WRITE = "write"
    EXTERNAL = "external"

    @property
    def rank(self) -> int:
        """Position in the order read < write < external."""
        return _RISK_ORDER[self]


_RISK_ORDER = {Risk.READ: 0, Risk.WRITE: 1, Risk.EXTERNAL: 2}


class ContractModel(BaseModel):
    """Base for capability input/output models: strict types, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


@dataclass(frozen=True, slots=True)
class Example:
    """One documented input → output pair of a capability."""

    input: dict[str, Any]
    output: dict[str, Any]

    def to_json(self) -> str:
        """The example as a JSON object ``{"input": ..., "output": ...}``."""
        return json.dumps({"input": self.input, "output": self.output}, sort_keys=True)


def is_capability_name(name: str) -> bool:
    """Dotted lowercase names such as ``kv.put`` or ``text.search``."""
    if not name or len(name) > 128:
        return False
    segments = name.split(".")
    return all(seg and seg[0].isalpha() and set(seg) <= set(_NAME_SEGMENT) for seg in segments)


def _checked_capability_name(value: str) -> str:
    if not is_capability_name(value):
        raise ValueError(f"{value!r} is not a dotted lowercase capability name")
    return value


CapabilityName = Annotated[str, AfterValidator(_checked_capability_name)]
"""A pydantic field type: a dotted lowercase capability name."""

MAX_PARTS = 64
"""Most parts a contract may take in one message."""


@dataclass(frozen=True, slots=True)
class Accepts:
    """Which parts a capability takes in a message (checked before its input is parsed).

    A part outside them is refused ``CONTENT_TYPE_NOT_SUPPORTED``; more parts than
    ``max_parts``, ``INVALID_REQUEST``. A text part is always accepted by a
    capability whose input is exactly one string field ``text`` (it becomes that
    input); a lone ``raw`` part of media type ``application/json`` is the JSON
    input itself, as a data part would be.

    Attributes:
        data: ``data`` parts (the first one is the input object).
        text: Text parts, whatever the input model.
        files: Media type patterns (``text/*``, ``image/png``, ``*/*``) of the file
            parts (bytes) it takes; none by default.
        urls: URL parts (file content by reference). The gateway never fetches them.
        max_parts: Most parts in one message (1-64).
    """

    data: bool = True
    text: bool = False
    files: tuple[str, ...] = ()
    urls: bool = False
    max_parts: int = 1

    def __post_init__(self) -> None:
        patterns = tuple(check_pattern(p, "Accepts.files") for p in self.files)
        object.__setattr__(self, "files", patterns)
        if not 1 <= self.max_parts <= MAX_PARTS:
            raise ValueError(f"Accepts.max_parts must be in 1..{MAX_PARTS}")

    def describe(self) -> str:
        """What it accepts, in words (for refusals and the card)."""
        kinds = [
            kind
            for kind, on in (("data", self.data), ("text", self.text), ("urls", self.urls))
            if on
        ]
        if self.files:
            kinds.append("files " + ", ".join(self.files))
        return "; ".join(kinds) or "nothing"


@dataclass(frozen=True, slots=True)
class Gives:
    """Which answers a capability may give (a reply outside them is ``INVALID_OUTPUT``).

    Attributes:
        data: Data parts (each validated against the output model).
        text: Text parts.
        files: Media type patterns of the file parts it may give.
        urls: URL parts.
        tasks: Answers that are tasks (an output object or a ``TaskReply``).
        messages: ``MessageReply`` answers (an A2A Message, no task kept).
    """

    data: bool = True
    text: bool = False
    files: tuple[str, ...] = ()
    urls: bool = False
    tasks: bool = True
    messages: bool = False

    def __post_init__(self) -> None:
        patterns = tuple(check_pattern(p, "Gives.files") for p in self.files)
        object.__setattr__(self, "files", patterns)
        if not (self.tasks or self.messages):
            raise ValueError("Gives: a capability must answer with tasks, messages or both")

    @property
    def messages_only(self) -> bool:
        """It always answers with a Message."""
        return self.messages and not self.tasks


@dataclass(frozen=True, slots=True)
class CapabilityContract:
    """The typed contract of one version of one capability.

    Attributes:
        name: Dotted capability name, e.g. ``kv.put``.
        version: Semantic version of this implementation.
        risk: ``read``, ``write`` or ``external``.
        timeout_seconds: Longest the capability may run before it is cancelled.
        idempotent: True if running it twice with the same input is harmless.
        input_model: Pydantic model of the input (extra fields forbidden).
        output_model: Pydantic model of the output (extra fields forbidden).
        description: What it does, for peers deciding whether to call it.
        preconditions: Conditions the caller should ensure, in prose.
        examples: Documented input/output pairs.
        accepts: The message parts it takes (default: one data part).
        gives: The answers it may give (default: its output object, as a task).
        asks_input: It may call ``ctx.ask_input`` (A2A only): a blocking
            SendMessage then answers when the task waits for input, and the
            task keeps its message history.
    """

    name: str
    version: Version
    risk: Risk
    timeout_seconds: float
    idempotent: bool
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    description: str = ""
    preconditions: tuple[str, ...] = ()
    examples: tuple[Example, ...] = field(default=())
    accepts: Accepts = field(default_factory=Accepts)
    gives: Gives = field(default_factory=Gives)
    asks_input: bool = False

    def __post_init__(self) -> None:
        if not is_capability_name(self.name):
            raise ValueError(f"capability name {self.name!r} must be dotted lowercase words")
        if not 0 < self.timeout_seconds <= 3600:
            raise ValueError(f"{self.name}: timeout_seconds must be in (0, 3600]")
        for role, model in (("input", self.input_model), ("output", self.output_model)):
            if model.model_config.get("extra") != "forbid" and model is not AnyObject:
                raise ValueError(
                    f"{self.name}: {role} model {model.__name__} must forbid extra fields "
                    "(or be capabilities.parts.AnyObject)"
                )

    @property
    def key(self) -> str:
        """``name@version``, unique in a registry."""
        return f"{self.name}@{self.version}"

    def input_schema(self) -> dict[str, Any]:
        """JSON Schema of the input."""
        return self.input_model.model_json_schema()

    def output_schema(self) -> dict[str, Any]:
        """JSON Schema of the output."""
        return self.output_model.model_json_schema()

    def input_fields(self) -> frozenset[str]:
        """Top-level field names the input declares."""
        return frozenset(self.input_model.model_fields)
