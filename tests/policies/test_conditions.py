"""Conditions over claims an issuer may shape any way: each one met, or not met, never an error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from policies.conditions import CallFacts, holds

IN_FINANCE = 'user.groups.exists(g, g == "finance")'


def facts(**user: Any) -> CallFacts:
    return CallFacts(
        caller="spiffe://example.org/agent/carol",
        user=user,
        actors=("spiffe://example.org/agent/carol",),
        capability="text.echo",
        version="1.0.0",
        risk="read",
        time=datetime.now(UTC),
        input=None,
    )


@pytest.mark.parametrize(
    ("groups", "why"),
    [
        (["engineering"], "false"),
        ([["finance"]], "false"),
        ("finance", "evaluation failed (TypeError)"),
        (None, "evaluation failed (TypeError)"),
        (True, "evaluation failed (TypeError)"),
        (1.5, "evaluation failed (TypeError)"),
        (2**70, "evaluation failed (TypeError)"),
        (float("nan"), "evaluation failed (TypeError)"),
    ],
    ids=["other-group", "nested-list", "string", "null", "boolean", "fraction", "huge", "nan"],
)
def test_a_claim_of_another_shape_is_a_condition_not_met(groups: Any, why: str) -> None:
    assert holds(IN_FINANCE, facts(groups=groups)) == (False, why)


def test_a_claim_the_condition_does_not_read_changes_nothing() -> None:
    assert holds(IN_FINANCE, facts(groups=["finance"], n=2**70, odd=None)) == (True, "")
