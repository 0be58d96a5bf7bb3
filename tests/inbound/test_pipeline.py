"""The decision order is written once, and Describe runs a prefix of it."""

from __future__ import annotations

from gateway.inbound.pipeline import CALL_CHECKS, DESCRIBE_CHECKS


def test_the_call_checks_run_in_the_documented_order() -> None:
    assert [check.name for check in CALL_CHECKS] == [
        "audit_available",
        "identity",
        "no_claimed_identity",
        "well_formed_request",
        "known_peer",
        "grant_live",
        "within_limits",
        "capability_granted",
        "version_available",
        "risk_within_grant",
        "payload_within_cap",
        "user_authorized",
        "parts_accepted",
        "payload_decoded",
        "first_sighting",
        "valid_input",
        "conditions_met",
        "deadline_ahead",
    ]


def test_describe_runs_the_capability_free_prefix_in_the_same_order() -> None:
    assert [check.name for check in DESCRIBE_CHECKS] == [
        "audit_available",
        "identity",
        "known_peer",
        "grant_live",
        "within_limits",
    ]
    positions = [CALL_CHECKS.index(check) for check in DESCRIBE_CHECKS]
    assert positions == sorted(positions)
