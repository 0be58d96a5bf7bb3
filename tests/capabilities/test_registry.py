"""Registering capabilities: contracts checked at definition, duplicates refused."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from capabilities import (
    CallContext,
    CapabilityRegistry,
    ContractModel,
    DuplicateCapability,
    VersionConstraint,
    capability,
)


class In(ContractModel):
    x: int


class Out(ContractModel):
    y: int


def make(version: str) -> object:
    @capability("math.double", version, risk="read")
    async def double(inp: In, ctx: CallContext) -> Out:
        """Double x."""
        return Out(y=inp.x * 2)

    return double


def test_versions_side_by_side_resolve_to_highest() -> None:
    registry = CapabilityRegistry()
    for version in ("1.0.0", "1.4.2", "2.0.0"):
        registry.register(make(version))  # type: ignore[arg-type]
    assert [str(v) for v in registry.versions("math.double")] == ["1.0.0", "1.4.2", "2.0.0"]
    found = registry.resolve("math.double", VersionConstraint.parse("^1"))
    assert found is not None and str(found.version) == "1.4.2"
    assert registry.resolve("math.double", VersionConstraint.parse("^3")) is None
    assert len(registry) == 3


def test_duplicate_name_and_version_is_refused() -> None:
    registry = CapabilityRegistry()
    registry.register(make("1.0.0"))  # type: ignore[arg-type]
    with pytest.raises(DuplicateCapability, match=r"math.double@1.0.0 is already registered"):
        registry.register(make("1.0.0"))  # type: ignore[arg-type]


def test_docstring_becomes_description() -> None:
    assert make("1.0.0").contract.description == "Double x."  # type: ignore[attr-defined]


class Loose(BaseModel):
    x: int


def test_models_must_forbid_extra_fields() -> None:
    with pytest.raises(ValueError, match="must forbid extra fields"):

        @capability("loose.thing", "1.0.0", risk="read")
        async def loose(inp: Loose, ctx: CallContext) -> Out:
            return Out(y=1)


@pytest.mark.parametrize("name", ["Bad", "no_dots!", "", ".x", "x..y", "1abc"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="dotted lowercase"):

        @capability(name, "1.0.0", risk="read")
        async def thing(inp: In, ctx: CallContext) -> Out:
            return Out(y=1)


def test_sync_functions_and_missing_hints_are_refused() -> None:
    with pytest.raises(TypeError, match="must be async"):
        capability("a.b", "1.0.0", risk="read")(lambda inp, ctx: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="annotate"):

        @capability("a.b", "1.0.0", risk="read")
        async def untyped(inp, ctx):  # type: ignore[no-untyped-def]
            return None


def test_bad_risk_and_timeout_are_refused() -> None:
    with pytest.raises(ValueError):
        make_with(risk="dangerous", timeout=1.0)
    with pytest.raises(ValueError, match="timeout_seconds"):
        make_with(risk="read", timeout=0.0)


def make_with(*, risk: str, timeout: float) -> object:
    @capability("a.b", "1.0.0", risk=risk, timeout=timeout)
    async def thing(inp: In, ctx: CallContext) -> Out:
        return Out(y=1)

    return thing
