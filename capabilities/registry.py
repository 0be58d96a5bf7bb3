"""Capabilities (contract + async function) and the versioned registry that holds them."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from capabilities.context import CallContext
from capabilities.contract import Accepts, CapabilityContract, Example, Gives, Risk
from capabilities.parts import AnyObject, MessageReply, TaskReply
from capabilities.versions import Version, VersionConstraint

Handler = Callable[[Any, CallContext], Awaitable[Any]]


class DuplicateCapability(ValueError):
    """A capability with the same name and version is already registered."""


@dataclass(frozen=True, slots=True)
class Capability:
    """One registered implementation: a contract and the function that fulfils it.

    Attributes:
        contract: What it promises.
        handler: The async function that runs it.
        upstream: For a capability that fronts an A2A agent (``[[upstreams]]``),
            that agent's name; empty for every other capability. Only such a
            capability may answer PEER_UNAVAILABLE for its upstream (see
            ``capabilities.runner``). ``@capability`` never sets it.
    """

    contract: CapabilityContract
    handler: Handler
    upstream: str = ""

    @property
    def name(self) -> str:
        """The contract's name."""
        return self.contract.name

    @property
    def version(self) -> Version:
        """The contract's version."""
        return self.contract.version


def capability(
    name: str,
    version: str,
    *,
    risk: Risk | str,
    timeout: float = 5.0,
    idempotent: bool = False,
    description: str | None = None,
    preconditions: Sequence[str] = (),
    examples: Sequence[Example] = (),
    accepts: Accepts | None = None,
    gives: Gives | None = None,
    asks_input: bool = False,
) -> Callable[[Callable[..., Awaitable[Any]]], Capability]:
    """Declare a typed async function as a capability.

    The function takes ``(input_model, ctx: CallContext)`` (``ctx`` optional) and
    returns an instance of its output model, or a ``TaskReply`` / ``MessageReply``
    (:mod:`capabilities.parts`); the models come from its type hints (a return
    hint of replies only has ``AnyObject`` as its output model, for the data
    parts of its replies). The docstring is the description unless one is given.
    ``accepts`` (default: one data part) and ``asks_input`` are the contract's;
    ``gives`` defaults to what the return hint names: tasks for an output model
    or ``TaskReply``, messages for ``MessageReply``, data parts only.

    Example::

        @capability("text.echo", "1.0.0", risk="read")
        async def echo(inp: EchoIn, ctx: CallContext) -> EchoOut: ...
    """

    def wrap(function: Callable[..., Awaitable[Any]]) -> Capability:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"capability {name}: {function.__name__} must be async")
        try:
            hints = typing.get_type_hints(function)
        except NameError as err:
            raise TypeError(f"capability {name}: cannot resolve type hints ({err})") from err
        params = list(inspect.signature(function).parameters)
        if not params or params[0] not in hints or "return" not in hints:
            raise TypeError(f"capability {name}: annotate the input parameter and return type")
        input_model = hints[params[0]]
        output_model, replies = _answers(name, hints["return"])
        for model in (input_model, output_model):
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise TypeError(f"capability {name}: {model!r} is not a pydantic model")
        if gives is None:
            tasks = TaskReply in replies or output_model is not AnyObject or not replies
            given = Gives(tasks=tasks, messages=MessageReply in replies)
        else:
            given = gives
        contract = CapabilityContract(
            name=name,
            version=Version.parse(version),
            risk=Risk(risk),
            timeout_seconds=timeout,
            idempotent=idempotent,
            input_model=input_model,
            output_model=output_model,
            description=description or inspect.cleandoc(function.__doc__ or ""),
            preconditions=tuple(preconditions),
            examples=tuple(examples),
            accepts=accepts if accepts is not None else Accepts(),
            gives=given,
            asks_input=asks_input,
        )
        handler = function if len(params) >= 2 else _ignore_context(function)
        return Capability(contract=contract, handler=handler)

    return wrap


def _answers(name: str, hint: Any) -> tuple[Any, set[type]]:
    """The output model and the reply types a return hint names (``Model | TaskReply``).

    A hint of replies only has :class:`AnyObject` as its output model.
    """
    members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if typing.get_origin(hint) is typing.Union:
        members = typing.get_args(hint)
    replies = {member for member in members if member in (TaskReply, MessageReply)}
    models = [member for member in members if member not in replies]
    if len(models) > 1:
        raise TypeError(f"capability {name}: return one output model (and replies), not several")
    return (models[0] if models else AnyObject), replies


def _ignore_context(function: Callable[[Any], Awaitable[Any]]) -> Handler:
    async def handler(payload: Any, ctx: CallContext) -> Any:
        return await function(payload)

    return handler


class CapabilityRegistry:
    """All capabilities of one agent, several versions of a name side by side."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[Version, Capability]] = {}

    def register(self, cap: Capability) -> Capability:
        """Add ``cap``; refuses a second registration of the same name and version."""
        versions = self._by_name.setdefault(cap.name, {})
        if cap.version in versions:
            raise DuplicateCapability(f"{cap.contract.key} is already registered")
        versions[cap.version] = cap
        return cap

    def versions(self, name: str) -> list[Version]:
        """Registered versions of ``name``, ascending."""
        return sorted(self._by_name.get(name, {}))

    def has(self, name: str) -> bool:
        """True if any version of ``name`` is registered."""
        return name in self._by_name

    def resolve(
        self,
        name: str,
        constraint: VersionConstraint,
        also: VersionConstraint | None = None,
    ) -> Capability | None:
        """Highest version of ``name`` admitted by ``constraint`` (and ``also``)."""
        versions = self._by_name.get(name)
        if not versions:
            return None
        best: Version | None = None
        for version in versions:
            if constraint.allows(version) and (also is None or also.allows(version)):
                if best is None or version > best:
                    best = version
        return None if best is None else versions[best]

    def __iter__(self) -> Iterator[Capability]:
        for name in sorted(self._by_name):
            for version in sorted(self._by_name[name]):
                yield self._by_name[name][version]

    def __len__(self) -> int:
        return sum(len(versions) for versions in self._by_name.values())
