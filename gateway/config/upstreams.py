"""``[[upstreams]]``: existing A2A agents whose skills this agent serves."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from capabilities.contract import MAX_PARTS, Accepts, CapabilityName, Gives, Risk
from capabilities.schema_models import SchemaNotSupported, contract_model
from capabilities.versions import Version, VersionSyntaxError
from gateway.config.addresses import (
    DialAddress,
    is_loopback_literal,
)
from gateway.config.fields import FrozenTable
from policies.identity import SpiffeId

_SKILL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class UpstreamAccepts(FrozenTable):
    """``accepts``: the parts of a caller's message a skill takes and passes on as they are.

    The keys and defaults of ``capabilities.contract.Accepts``.

    Attributes:
        data: ``data`` parts (the first one is the input, checked against
            ``input_schema`` when the skill has one).
        text: Text parts.
        files: Media type patterns (``text/*``, ``image/png``, ``*/*``) of the file
            parts (bytes) it takes.
        urls: URL parts (never fetched by the gateway).
        max_parts: Most parts in one message (1-64).
    """

    data: bool = True
    text: bool = False
    files: tuple[str, ...] = ()
    urls: bool = False
    max_parts: int = Field(default=1, ge=1, le=MAX_PARTS)

    @model_validator(mode="after")
    def _patterns(self) -> UpstreamAccepts:
        self.contract()  # raises ValueError naming a bad media type pattern
        return self

    def contract(self) -> Accepts:
        """The contract's ``accepts``."""
        return Accepts(
            data=self.data,
            text=self.text,
            files=self.files,
            urls=self.urls,
            max_parts=self.max_parts,
        )


class UpstreamGives(FrozenTable):
    """``gives``: the answers of a skill passed back as the upstream gave them.

    The keys and defaults of ``capabilities.contract.Gives``.

    Attributes:
        data: Data parts (each a JSON object, checked against ``output_schema``
            when the skill has one).
        text: Text parts.
        files: Media type patterns of the file parts it may answer with.
        urls: URL parts.
        tasks: Task answers (artifacts and a final status message).
        messages: Message answers (the caller gets a Message; no task is kept).
    """

    data: bool = True
    text: bool = False
    files: tuple[str, ...] = ()
    urls: bool = False
    tasks: bool = True
    messages: bool = False

    @model_validator(mode="after")
    def _valid(self) -> UpstreamGives:
        self.contract()  # raises ValueError: a bad pattern, or neither tasks nor messages
        return self

    def contract(self) -> Gives:
        """The contract's ``gives``."""
        return Gives(
            data=self.data,
            text=self.text,
            files=self.files,
            urls=self.urls,
            tasks=self.tasks,
            messages=self.messages,
        )


class UpstreamSkill(FrozenTable):
    """One skill of an upstream A2A agent, served here as a local capability.

    Attributes:
        skill: The upstream's skill id (1-128 of ``A-Za-z0-9._:/-``); sent to it
            as message metadata ``a2agw.skill``.
        capability: The capability name it becomes here (e.g. ``legacy.echo``).
        version: That capability's ``MAJOR.MINOR.PATCH`` version.
        risk: ``read``, ``write`` or ``external``, as grants see it.
        timeout: Seconds one call may take, the upstream's answer included.
        idempotent: True if calling the skill twice with the same input is harmless.
        description: What it does, for peers (Describe, the A2A card).
        input_schema: JSON Schema (object, the subset of
            ``capabilities.schema_models``) of the input; the validated object is
            sent as one ``data`` part. Default: ``{"text": string}``, sent as
            one text part.
        output_schema: JSON Schema of the output, read from the answer's first
            ``data`` part. Default: ``{"text": string}``, the answer's text
            parts joined.
        accepts: The parts of a caller's A2A message it takes, each sent on as it
            came (the first data part as ``input_schema`` validated it; any
            object without one). None: the input above.
        gives: The answers passed back as the upstream gave them (a Message, or a
            task's artifacts and final status text; each part checked, data parts
            against ``output_schema`` when declared). None: the output above.
        asks_input: The upstream may ask its caller for input or authorization
            (a task ``INPUT_REQUIRED``/``AUTH_REQUIRED``): over A2A the caller's
            task then waits in that state, and its next message on the task goes
            to the same upstream task. False: such an answer fails the call, and
            the task keeps no message history. None (default): true for a skill
            with ``accepts`` or ``gives``, false for one without (its blocking
            calls then run inline, the cheaper path; see :attr:`asks_caller`).
    """

    skill: str
    capability: CapabilityName
    version: str
    risk: Risk
    timeout: float = Field(gt=0, le=3600)
    idempotent: bool = False
    description: str = Field(default="", max_length=2000)
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    accepts: UpstreamAccepts | None = None
    gives: UpstreamGives | None = None
    asks_input: bool | None = None

    @field_validator("skill")
    @classmethod
    def _skill_id(cls, value: str) -> str:
        if not _SKILL_ID.fullmatch(value):
            raise ValueError("must be 1-128 characters of A-Za-z0-9._:/- (starting alphanumeric)")
        return value

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        try:
            Version.parse(value)
        except VersionSyntaxError as err:
            raise ValueError(str(err)) from err
        return value

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _supported_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                contract_model("Checked", value)
            except SchemaNotSupported as err:
                raise ValueError(f"unsupported JSON Schema: {err}") from err
        return value

    @property
    def asks_caller(self) -> bool:
        """Whether the upstream's questions reach the caller (``asks_input`` resolved)."""
        if self.asks_input is not None:
            return self.asks_input
        return self.accepts is not None or self.gives is not None

    @model_validator(mode="after")
    def _input_parts(self) -> UpstreamSkill:
        if self.input_schema is not None and self.accepts is not None and not self.accepts.data:
            raise ValueError("input_schema describes a data part: accepts.data must be true")
        if self.output_schema is not None and self.gives is not None and not self.gives.data:
            raise ValueError("output_schema describes data parts: gives.data must be true")
        return self


class UpstreamEntry(FrozenTable):
    """An existing A2A agent whose skills this agent serves as its own capabilities.

    Attributes:
        id: The upstream's SPIFFE ID: it is called over mTLS with this agent's
            certificate and must present a certificate for this ID. Omit only
            for plaintext to a loopback address.
        binding: ``grpc`` (``address``) or ``jsonrpc`` (``url``).
        address: ``host:port`` of its gRPC A2A service (binding ``grpc``).
        url: Its JSON-RPC endpoint, ``https://...`` (needs ``id``) or
            ``http://`` to a loopback address (binding ``jsonrpc``).
        skills: The skills served here (at least one).
        streaming: It serves ``SendStreamingMessage`` (gRPC server stream, or
            JSON-RPC over SSE): a call whose caller follows its A2A task
            (streamed or in the background) is streamed from it, its status
            texts and output chunks passed on as they come (default false:
            one message, its task polled to the end).
    """

    id: SpiffeId | None = None
    binding: Literal["grpc", "jsonrpc"] = "grpc"
    address: DialAddress | None = None
    url: str | None = Field(default=None, min_length=8, max_length=2000)
    skills: tuple[UpstreamSkill, ...] = Field(min_length=1)
    streaming: bool = False

    @property
    def name(self) -> str:
        """How logs and audit details name it: its SPIFFE ID, else its address or URL."""
        return self.id or self.address or self.url or ""

    @property
    def plaintext(self) -> bool:
        """True when calls to it are not protected by TLS (loopback only)."""
        return self.id is None

    @model_validator(mode="after")
    def _consistent(self) -> UpstreamEntry:
        if self.binding == "grpc":
            if self.address is None or self.url is not None:
                raise ValueError("binding grpc takes address (host:port), not url")
            host = self.address.rsplit(":", 1)[0].strip("[]")
            if self.id is None and not is_loopback_literal(host):
                raise ValueError("id: required unless address is a loopback IP (plaintext)")
        else:
            if self.url is None or self.address is not None:
                raise ValueError("binding jsonrpc takes url, not address")
            self._check_url(self.url)
        skills = [entry.skill for entry in self.skills]
        if len(skills) != len(set(skills)):
            raise ValueError("skills: a skill id appears twice")
        return self

    def _check_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: must be http:// or https:// with a host")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("url: no credentials, query or fragment")
        if parts.scheme == "https" and self.id is None:
            raise ValueError("id: required for an https url (the server's identity is checked)")
        if parts.scheme == "http":
            if self.id is not None:
                raise ValueError("url: http:// cannot prove the id; use https:// or omit id")
            if not is_loopback_literal(parts.hostname):
                raise ValueError("url: plaintext http:// only to a loopback IP")
