"""``policy explain`` and ``policy backtest`` judge users and conditions from what they have.

explain is given the user's claims and the input; backtest has only what the
audit log keeps (the user's subject and actors), so it judges ``users =
"required"`` and skips ``user_claims`` and the conditions.
"""

from __future__ import annotations

from datetime import UTC, datetime

from capabilities.builtin.echo import echo
from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.admin.policy_backtest import backtest, decide
from gateway.audit import AuditRecord
from policies.grants import PolicyDocument
from policies.policy_file import Policy
from policies.users import OnBehalfOf
from tests.support import grant, spiffe

CAROL = spiffe("carol")


def policy() -> Policy:
    entry = grant("carol", ["text.echo"]) | {
        "users": "required",
        "user_claims": {"groups": "finance"},
        "when": {"short": "size(input.text) < 5"},
    }
    return Policy.from_document(PolicyDocument.model_validate({"grants": [entry]}))


def registry() -> CapabilityRegistry:
    found = CapabilityRegistry()
    found.register(echo)
    return found


def explain(**kwargs: object) -> tuple[str, str, tuple[str, ...]]:
    verdict = decide(
        policy(),
        registry(),
        peer_id=CAROL,
        capability="text.echo",
        constraint=VersionConstraint.parse(""),
        payload_size=10,
        now=datetime.now(UTC),
        **kwargs,  # type: ignore[arg-type]
    )
    return verdict.reason, verdict.step, verdict.skipped


def user(groups: list[str]) -> OnBehalfOf:
    return OnBehalfOf.of("u-1", "idp", {"sub": "u-1", "groups": groups}, (CAROL,))


def test_explain_judges_the_user_its_claims_and_the_conditions() -> None:
    assert explain()[:2] == ("USER_NOT_AUTHORIZED", "user_authorized")
    assert explain(user=user(["eng"]))[:2] == ("USER_NOT_AUTHORIZED", "user_authorized")
    assert explain(user=user(["finance"])) == (
        "OK",
        "",
        ("conditions_met (short: needs --input)",),
    )
    assert explain(user=user(["finance"]), payload={"text": "hi"}) == ("OK", "", ())
    reason, step, _ = explain(user=user(["finance"]), payload={"text": "far too long"})
    assert (reason, step) == ("CONDITION_NOT_MET", "conditions_met")


def test_backtest_judges_the_recorded_user_and_skips_what_the_log_does_not_keep() -> None:
    def record(on_behalf_of: str) -> AuditRecord:
        return AuditRecord(
            time_unix_ms=int(datetime.now(UTC).timestamp() * 1000),
            request_id="r",
            peer_id=CAROL,
            capability="text.echo",
            version_constraint="",
            served_version="1.0.0",
            decision="allow",
            reason="OK",
            payload_size=10,
            payload_sha256="",
            latency_ms=1.0,
            on_behalf_of=on_behalf_of,
            actor_chain=f'["{CAROL}"]' if on_behalf_of else "",
        )

    report = backtest([record("u-1"), record("")], policy(), registry())
    assert report.considered == 2
    assert [(c.record.on_behalf_of, c.after.reason) for c in report.changes] == [
        ("", "USER_NOT_AUTHORIZED")
    ]
