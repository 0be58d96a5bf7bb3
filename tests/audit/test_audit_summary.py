"""``audit --summary`` counts: aggregated limit refusals by their count, every other record as one."""

from __future__ import annotations

import pytest

from gateway.audit.summary import calls_in, limit_count_detail, summarize
from tests.helpers.audit_logs import RecordFactory


@pytest.mark.parametrize("reason", ["RATE_LIMITED", "CONCURRENCY_LIMITED", "SERVER_BUSY"])
def test_limit_refusals_count_as_their_aggregated_calls(
    make_record: RecordFactory, reason: str
) -> None:
    first = make_record(decision="refuse", reason=reason, detail=limit_count_detail(1))
    later = make_record(decision="refuse", reason=reason, detail=limit_count_detail(41, 998))
    assert (calls_in(first), calls_in(later)) == (1, 41)
    [row] = summarize([first, later])
    assert (row.reason, row.calls, row.records) == (reason, 42, 2)


@pytest.mark.parametrize(
    ("decision", "reason", "detail"),
    [
        ("allow", "IDEMPOTENCY_RESOLVED", "key 'k count=999999 x'; operator: r"),
        ("allow", "IDEMPOTENCY_RESOLVED", "count=999999"),
        ("refuse", "IDEMPOTENCY_IN_DOUBT", "count=999999 window_ms=1"),
        ("refuse", "UNAVAILABLE", "count=999999"),
        ("allow", "RATE_LIMITED", "count=999999"),  # a limit reason is always a refusal
        ("refuse", "RATE_LIMITED", "count=999999 x"),  # not the aggregator's grammar
        ("refuse", "RATE_LIMITED", "x count=999999"),
        ("refuse", "RATE_LIMITED", "count=0"),
        ("refuse", "RATE_LIMITED", "count=-5"),
        ("refuse", "RATE_LIMITED", "count=99999999999999999999999"),
    ],
)
def test_text_that_looks_like_a_count_is_one_call(
    make_record: RecordFactory, decision: str, reason: str, detail: str
) -> None:
    record = make_record(decision=decision, reason=reason, detail=detail)
    assert calls_in(record) == 1
