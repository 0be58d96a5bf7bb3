"""Pure verification logic: comparing answers, deterministic checks, JSON paths, plan fields."""

from __future__ import annotations

import pytest

from gateway.errors import ExpectationFailed, PlanInvalid
from gateway.plans.document.json_paths import has_path, read_path
from gateway.plans.document.model import Expect, Verify, parse_plan
from gateway.plans.execution.verification import (
    Confidence,
    check_deterministic,
    comparison_digest,
    is_deterministically_verified,
    judge,
    weakest,
)

TWO = Verify(quorum=2)


def test_all_agreeing_at_quorum_is_verified() -> None:
    verdict = judge(TWO, ["a", "a"])
    assert (verdict.confidence, verdict.chosen, verdict.candidates) == (
        Confidence.VERIFIED,
        0,
        (),
    )


def test_fewer_answers_than_the_quorum_is_partial() -> None:
    assert judge(Verify(quorum=3), ["a", "a"]).confidence is Confidence.PARTIAL
    assert judge(TWO, ["a"]).confidence is Confidence.PARTIAL


def test_disagreement_keeps_one_candidate_per_output_and_picks_the_majority() -> None:
    verdict = judge(Verify(quorum=3), ["b", "a", "a"])
    assert verdict.confidence is Confidence.UNVERIFIED
    assert verdict.candidates == (0, 1)
    assert verdict.chosen == 1


def test_judging_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        judge(TWO, [])


def test_weakest() -> None:
    assert weakest([Confidence.VERIFIED, Confidence.PARTIAL]) is Confidence.PARTIAL
    assert weakest([]) is Confidence.UNVERIFIED


def test_comparison_digest_is_canonical_and_can_pick_paths() -> None:
    assert comparison_digest({"a": 1, "b": 2}) == comparison_digest({"b": 2, "a": 1})
    assert comparison_digest({"a": 1, "b": 2}) != comparison_digest({"a": 1, "b": 3})
    assert comparison_digest({"a": 1, "b": 2}, ["a"]) == comparison_digest({"a": 1, "b": 3}, ["a"])
    assert comparison_digest({"a": 1}, ["x"]) != comparison_digest({"x": None}, ["x"])


def test_deterministic_checks() -> None:
    expect = Expect.model_validate(
        {"equals": {"items.0.id": "d"}, "range": {"n": {"min": 1, "max": 2}}}
    )
    assert is_deterministically_verified("s", expect, {"items": [{"id": "d"}], "n": 2}) is True
    assert is_deterministically_verified("s", Expect.model_validate({"schema": {}}), {}) is False
    assert is_deterministically_verified("s", None, {}) is False
    for bad in (
        {"items": [{"id": "e"}], "n": 1},
        {"items": [], "n": 1},
        {"items": [{"id": "d"}], "n": 3},
    ):
        with pytest.raises(ExpectationFailed) as caught:
            check_deterministic("s", expect, bad)
        assert "step 's'" in caught.value.message and '"e"' not in caught.value.message
    with pytest.raises(ExpectationFailed, match="not a number"):
        check_deterministic("s", expect, {"items": [{"id": "d"}], "n": True})
    with pytest.raises(ExpectationFailed):  # True is not 1
        check_deterministic("s", Expect.model_validate({"equals": {"x": 1}}), {"x": True})


def test_json_paths() -> None:
    value = {"items": [{"title": "t"}], "n": 0}
    assert read_path(value, "items.0.title") == "t"
    assert has_path(value, "n") and not has_path(value, "items.1")
    with pytest.raises(KeyError):
        read_path(value, "n.x")


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"verify": {"quorum": 1}}, "verify.quorum"),
        ({"verify": {"quorum": 2, "compare": ["a..b"]}}, "verify.compare"),
        ({"expect": {"range": {"n": {"min": 3, "max": 1}}}}, "expect.range"),
        ({"expect": {"range": {"n": {}}}}, "expect.range"),
        ({"on_unverified": "ignore"}, "on_unverified"),
    ],
)
def test_bad_verification_fields_are_plan_invalid(extra: dict[str, object], where: str) -> None:
    import json

    step = {"id": "s", "capability": "a.b", **extra}
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(json.dumps({"goal": "g", "steps": [step]}))
    assert where in caught.value.message and "(step 's')" in caught.value.message


def test_approval_and_tool_budget_parse() -> None:
    plan = parse_plan(
        '{"goal": "g", "approval": {"min_risk": "external"}, "budget": {"max_tool_calls": 0},'
        ' "steps": [{"id": "s", "capability": "a.b"}]}'
    )
    assert plan.approval is not None and plan.approval.min_risk.value == "external"
    assert plan.budget.max_tool_calls == 0
    assert parse_plan(plan.to_json()) == plan
