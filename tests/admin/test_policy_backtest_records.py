"""Which audit records `policy replay` re-decides: served calls and policy refusals only."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from gateway.admin.policy_backtest import backtest, recorded_policy_decision
from gateway.audit import AuditRecord
from gateway.plans.execution.approval import ApprovalRequest, audit_record
from policies.policy_file import Policy, load_policy
from tests.helpers.agents import grant, spiffe, write_policy

BOB = spiffe("bob")


def _record(decision: str, reason: str, detail: str = "") -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"r-{reason}",
        peer_id=BOB,
        capability="kv.put",
        version_constraint="^1",
        served_version="1.0.0",
        decision=decision,  # type: ignore[arg-type]
        reason=reason,
        payload_size=10,
        payload_sha256=hashlib.sha256(b"x").hexdigest(),
        latency_ms=1.0,
        detail=detail,
    )


# Every record of a call the policy let through whose outcome is not a served answer,
# and records no peer's call made: the README says these are left alone.
LEFT_ALONE = [
    ("allow", "ADMITTED", ""),
    ("allow", "CAPABILITY_FAILED", ""),
    ("allow", "CAPABILITY_TIMEOUT", ""),
    ("allow", "INVALID_OUTPUT", ""),
    ("allow", "INVALID_INPUT", ""),
    ("allow", "DEADLINE_EXCEEDED", ""),
    ("allow", "CANCELLED", ""),
    ("allow", "IDEMPOTENCY_IN_DOUBT", "attempt cut off"),
    ("refuse", "IDEMPOTENCY_IN_DOUBT", ""),
    ("allow", "IDEMPOTENCY_RESOLVED", "key 'k'; operator: checked"),
    ("allow", "IDEMPOTENCY_RELEASED", "key 'k'; operator: rolled back"),
    ("refuse", "REPLAYED_REQUEST", ""),
    ("refuse", "AUDIT_UNAVAILABLE", ""),
    ("refuse", "RATE_LIMITED", "count=1"),
]


@pytest.fixture
def refuse_all(tmp_path: Path) -> Policy:
    """A candidate under which bob may call nothing he called (kv.put not granted)."""
    return load_policy(write_policy(tmp_path / "candidate.toml", [grant("bob", ["text.echo"])]))


@pytest.mark.parametrize(("decision", "reason", "detail"), LEFT_ALONE)
def test_records_that_are_not_policy_decisions_are_left_alone(
    refuse_all: Policy, decision: str, reason: str, detail: str
) -> None:
    record = _record(decision, reason, detail)
    assert recorded_policy_decision(record) is None
    report = backtest([record], refuse_all, None)
    assert (report.considered, report.not_policy, report.changes) == (0, 1, [])


def test_a_persons_approval_is_not_a_policy_decision(refuse_all: Policy) -> None:
    request = ApprovalRequest(
        step_id="s",
        capability="kv.put",
        where="local",
        version="1.0.0",
        risk="write",
        input_sha256="0" * 64,
        fields={"key": 3},
    )
    records = [
        audit_record(BOB, "t", request, approved=True, who="ops"),
        audit_record(BOB, "t", request, approved=False, who="ops"),
    ]
    report = backtest(records, refuse_all, None)
    assert (report.considered, report.not_policy, report.changes) == (0, 2, [])


def test_served_calls_and_policy_refusals_are_re_decided(refuse_all: Policy) -> None:
    served = _record("allow", "OK")
    replayed = _record("allow", "OK", "idempotent replay")
    refused = _record("refuse", "CAPABILITY_NOT_GRANTED")
    report = backtest([served, replayed, refused], refuse_all, None)
    assert (report.considered, report.not_policy) == (3, 0)
    assert [(c.record.request_id, c.direction) for c in report.changes] == [
        ("r-OK", "allowed → refused"),
        ("r-OK", "allowed → refused"),
    ]
