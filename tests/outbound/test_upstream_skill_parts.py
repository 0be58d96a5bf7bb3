"""``[[upstreams.skills]]`` accepts, gives and asks_input: validated, and the contract they make."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from capabilities.contract import Accepts, Gives
from capabilities.parts import AnyObject
from gateway.config import UpstreamSkill
from gateway.outbound.upstream_capabilities import TextInput, TextOutput, upstream_capability

BASE = {"skill": "s", "capability": "legacy.s", "version": "1.0.0", "risk": "read", "timeout": 5}
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


class _Client:
    name = "spiffe://example.org/agent/legacy"


def contract(**keys: Any) -> Any:
    skill = UpstreamSkill.model_validate({**BASE, **keys})
    return upstream_capability(skill, _Client()).contract  # type: ignore[arg-type]


def test_without_accepts_or_gives_a_skill_is_text_in_text_out_and_asks_only_if_told() -> None:
    made = contract()
    assert (made.input_model, made.output_model) == (TextInput, TextOutput)
    assert (made.accepts, made.gives, made.asks_input) == (Accepts(text=True), Gives(), False)
    assert contract(input_schema=SCHEMA).accepts == Accepts()  # data only, as before
    assert contract(asks_input=True).asks_input


@pytest.mark.parametrize("keys", [{"accepts": {}}, {"gives": {}}], ids=["accepts", "gives"])
def test_a_skill_that_passes_parts_asks_its_caller_unless_told_not_to(
    keys: dict[str, Any],
) -> None:
    assert contract(**keys).asks_input
    assert not contract(**keys, asks_input=False).asks_input


def test_accepts_and_gives_make_the_contract() -> None:
    made = contract(
        accepts={"text": True, "files": ["Text/*"], "urls": True, "max_parts": 8},
        gives={"text": True, "files": ["*/*"], "messages": True, "tasks": False},
        asks_input=False,
    )
    assert made.accepts == Accepts(text=True, files=("text/*",), urls=True, max_parts=8)
    assert made.gives == Gives(text=True, files=("*/*",), messages=True, tasks=False)
    assert (made.input_model, made.output_model, made.asks_input) == (AnyObject, AnyObject, False)
    schemas = contract(accepts={}, gives={}, input_schema=SCHEMA, output_schema=SCHEMA)
    assert schemas.input_model.model_json_schema()["required"] == ["q"]
    assert schemas.output_model is not AnyObject


@pytest.mark.parametrize(
    "keys",
    [
        {"accepts": {"files": ["text"]}},
        {"accepts": {"max_parts": 0}},
        {"accepts": {"max_parts": 65}},
        {"accepts": {"fetch": True}},
        {"gives": {"tasks": False}},  # neither tasks nor messages
        {"gives": {"files": ["*"]}},
        {"gives": {"max_parts": 2}},
        {"accepts": {"data": False}, "input_schema": SCHEMA},
        {"gives": {"data": False, "text": True}, "output_schema": SCHEMA},
        {"asks_input": "maybe"},
    ],
)
def test_what_a_skill_cannot_say_is_refused_at_load(keys: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        UpstreamSkill.model_validate({**BASE, **keys})
