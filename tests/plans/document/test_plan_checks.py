"""Plan validation and the static checks: each problem has a message naming the step."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capabilities.contract import Risk
from capabilities.versions import Version
from gateway.errors import ConfigError
from gateway.outbound.router import Offer
from gateway.plans import PlanInvalid, PlanLimits, check_routes, check_structure, parse_plan
from gateway.plans.document.checks import step_order
from gateway.plans.document.model import resolve_input


def plan(steps: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps({"goal": "test", "steps": steps, **extra})


def step(sid: str, cap: str = "text.echo", **extra: Any) -> dict[str, Any]:
    return {"id": sid, "capability": cap, "input": {"text": sid}, **extra}


def offer(cap: str, version: str = "1.0.0", risk: Risk = Risk.READ, where: str = "local") -> Offer:
    return Offer(cap, Version.parse(version), risk, True, where, frozenset({"text"}), {})


def invalid(text: str, limits: PlanLimits | None = None) -> str:
    with pytest.raises(PlanInvalid) as info:
        check_structure(parse_plan(text), limits or PlanLimits())
    assert isinstance(info.value, ConfigError)
    assert info.value.reason == "PLAN_INVALID"
    return info.value.message


def test_valid_plan_gives_a_dependency_order() -> None:
    text = plan([step("b", depends_on=["a"]), step("a"), step("c", depends_on=["a", "b"])])
    assert step_order(parse_plan(text), PlanLimits()) == ("a", "b", "c")


def test_defaults_fail_closed_on_risk() -> None:
    assert parse_plan(plan([step("a")])).max_risk is Risk.READ


def test_duplicate_ids() -> None:
    assert invalid(plan([step("a"), step("a")])) == "step id 'a' appears more than once"


def test_unknown_dependency() -> None:
    assert invalid(plan([step("a", depends_on=["zz"])])) == "step 'a' depends on unknown step 'zz'"


def test_self_dependency() -> None:
    assert invalid(plan([step("a", depends_on=["a"])])) == "step 'a' depends on itself"


def test_cycle_names_the_steps_in_it() -> None:
    text = plan(
        [
            step("ok"),
            step("a", depends_on=["c"]),
            step("b", depends_on=["a"]),
            step("c", depends_on=["b", "ok"]),
        ]
    )
    assert invalid(text) == "dependency cycle among steps 'a', 'b', 'c'"


def test_reference_to_a_step_that_is_not_a_dependency() -> None:
    text = plan(
        [
            step("a"),
            step("b"),
            {
                "id": "c",
                "capability": "text.echo",
                "depends_on": ["a"],
                "input": {"text": {"$from": "b.text"}},
            },
        ]
    )
    assert invalid(text) == "step 'c' references 'b.text' but does not depend on 'b'"


def test_nested_reference_is_found() -> None:
    text = plan(
        [
            step("a"),
            {"id": "c", "capability": "text.echo", "input": {"deep": [{"x": {"$from": "a.text"}}]}},
        ]
    )
    assert invalid(text) == "step 'c' references 'a.text' but does not depend on 'a'"


def test_more_steps_than_the_cap() -> None:
    text = plan([step(f"s{i}") for i in range(4)])
    assert invalid(text, PlanLimits(max_steps=3)) == (
        "plan has 4 steps; this agent accepts at most 3"
    )


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"id": "1bad", "capability": "text.echo"}, "steps.0.id (step '1bad')"),
        ({"id": "a", "capability": "Not A Name"}, "steps.0.capability (step 'a')"),
        ({"id": "a", "capability": "text.echo", "version": ">>1"}, "steps.0.version (step 'a')"),
        ({"id": "a", "capability": "text.echo", "max_retries": -1}, "steps.0.max_retries"),
        ({"id": "a", "capability": "text.echo", "surprise": 1}, "steps.0.surprise (step 'a')"),
    ],
)
def test_malformed_step_is_refused_with_its_key(bad: dict[str, Any], fragment: str) -> None:
    with pytest.raises(PlanInvalid) as info:
        parse_plan(plan([bad]), "p.json")
    assert f"p.json: {fragment}" in info.value.message


def test_not_json_is_refused() -> None:
    with pytest.raises(PlanInvalid):
        parse_plan("{not json")


def test_empty_plan_is_refused() -> None:
    with pytest.raises(PlanInvalid):
        parse_plan(plan([]))


def test_unavailable_capability() -> None:
    p = parse_plan(plan([step("a"), step("b", "kv.get", version="^2")]))
    with pytest.raises(PlanInvalid) as info:
        check_routes(p, {"text.echo": [offer("text.echo")], "kv.get": [offer("kv.get")]})
    assert info.value.message == (
        "step 'b': no local capability or authorized peer offers kv.get@^2"
    )


def test_risk_above_the_task() -> None:
    p = parse_plan(plan([step("w", "kv.put")]))
    with pytest.raises(PlanInvalid) as info:
        check_routes(p, {"kv.put": [offer("kv.put", risk=Risk.WRITE, where="spiffe://x/a")]})
    assert info.value.message == "step 'w': kv.put has risk write; this task allows up to read"


def test_risk_within_the_task_passes() -> None:
    p = parse_plan(plan([step("w", "kv.put")], max_risk="write"))
    check_routes(p, {"kv.put": [offer("kv.put", risk=Risk.WRITE)]})


def test_avoided_peer_does_not_count() -> None:
    p = parse_plan(plan([step("a", avoid=["spiffe://x/a"])]))
    with pytest.raises(PlanInvalid):
        check_routes(p, {"text.echo": [offer("text.echo", where="spiffe://x/a")]})


def test_resolve_input_follows_paths_and_indices() -> None:
    outputs = {"s": {"items": [{"id": "d1", "title": "T"}]}}
    value = {"key": {"$from": "s.items.0.id"}, "all": {"$from": "s.items"}, "n": 3}
    assert resolve_input(value, outputs) == {
        "key": "d1",
        "all": [{"id": "d1", "title": "T"}],
        "n": 3,
    }
    with pytest.raises(KeyError):
        resolve_input({"$from": "s.items.5"}, outputs)


def test_plan_round_trips_through_json() -> None:
    text = plan([step("a", expect={"schema": {"type": "object"}})], max_risk="write")
    p = parse_plan(text)
    assert parse_plan(p.to_json()) == p
