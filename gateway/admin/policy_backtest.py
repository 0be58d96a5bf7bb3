"""Backtesting a candidate policy on recorded calls (``policy backtest``), and explaining one
decision.

"Replay" in this package means request-id replay protection only; re-deciding
the audit log under another policy is a *backtest*.

Only the policy's own steps (``policies.decisions.POLICY_STEPS``) are
re-decided, each over a ``PolicyQuery`` built from an audit record: the
caller's SPIFFE ID, capability, version constraint, payload size and the
record's time (so a grant's ``expires_at`` is judged at the time of the call).
What is not a policy decision is left alone: refusals before the policy
(``UNAUTHENTICATED``, ``INVALID_REQUEST``, ``AUDIT_UNAVAILABLE``), limit
refusals, what happened after it (``REPLAYED_REQUEST``, ``INVALID_INPUT``,
``DEADLINE_EXCEEDED``, ``IDEMPOTENCY_IN_DOUBT``, failures of the capability),
records no peer's call made (operator resolutions, approvals), and Describe.
An allowed call is judged by its served (``OK``) record only.

``version_available`` and ``risk_within_grant`` need the agent's capabilities
(versions and risks). Without a registry they are skipped, and a call whose
recorded refusal came from one of them is not judged.

Users and conditions: a record names the user a call acted for
(``on_behalf_of``, ``actor_chain``) but not the user's claims nor the input,
so a backtest judges ``users = "required"`` (was there a user?) and skips
``user_claims`` and the conditions (``when``); ``policy explain`` judges all
of them from the user claims and input it is given (a condition that reads
``input`` is skipped without one).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.audit import AuditRecord
from gateway.errors import (
    CapabilityNotGranted,
    ConditionNotMet,
    GatewayError,
    GrantExpired,
    PayloadTooLarge,
    RiskNotGranted,
    UnknownPeer,
    UserNotAuthorized,
    VersionNotAvailable,
)
from policies.conditions import holds, uses_input
from policies.decisions import (
    POLICY_STEPS,
    PolicyQuery,
    risk_within_grant,
    user_authorized,
    version_available,
)
from policies.policy_file import Policy
from policies.users import OnBehalfOf

POLICY_REASONS: frozenset[str] = frozenset(
    cls.reason
    for cls in (
        UnknownPeer,
        GrantExpired,
        CapabilityNotGranted,
        VersionNotAvailable,
        RiskNotGranted,
        PayloadTooLarge,
        UserNotAuthorized,
    )
)
"""Refusals the policy steps make; the only refusals that are re-decided."""

SERVED = "OK"
"""The reason of an allowed call's outcome record when the capability answered."""

REGISTRY_STEPS: frozenset[str] = frozenset({version_available.__name__, risk_within_grant.__name__})
"""Steps that need the agent's capabilities (skipped without ``--config``)."""

_STEP_OF_REASON = {
    UnknownPeer.reason: "known_peer",
    GrantExpired.reason: "grant_live",
    CapabilityNotGranted.reason: "capability_granted",
    VersionNotAvailable.reason: version_available.__name__,
    RiskNotGranted.reason: risk_within_grant.__name__,
    PayloadTooLarge.reason: "payload_within_cap",
    UserNotAuthorized.reason: user_authorized.__name__,
}
CONDITIONS_STEP = "conditions_met"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy decides for one call.

    Attributes:
        decision: ``allow`` or ``refuse``.
        reason: ``OK`` or the refusal's reason code.
        step: Name of the POLICY_STEPS function that refused (``""`` if allowed).
        message: The refusal's message (never payload content).
        skipped: Steps not run (they need a registry that was not given).
    """

    decision: str
    reason: str
    step: str = ""
    message: str = ""
    skipped: tuple[str, ...] = ()


def decide(
    policy: Policy,
    registry: CapabilityRegistry | None,
    *,
    peer_id: str,
    capability: str,
    constraint: VersionConstraint,
    payload_size: int,
    now: datetime,
    user: OnBehalfOf | None = None,
    payload: Mapping[str, Any] | None = None,
    claims_known: bool = True,
) -> Verdict:
    """Run the policy steps in order; the first refusal (and its step) answers.

    Without ``registry`` the steps in :data:`REGISTRY_STEPS` are skipped, and
    the conditions too (they read the version). ``user``: the user the call
    acts for; ``claims_known`` false (a backtest: the audit log keeps the
    subject, not the claims) skips ``user_claims`` and the conditions;
    ``payload``: the input's fields (None: a condition reading ``input`` is
    skipped).
    """
    query = PolicyQuery(
        policy,
        registry if registry is not None else CapabilityRegistry(),
        peer_id,
        capability,
        constraint,
        payload_size,
        now,
    )
    query.user = user
    skipped: list[str] = []
    for step in POLICY_STEPS:
        if registry is None and step.__name__ in REGISTRY_STEPS:
            skipped.append(step.__name__)
            continue
        if step is user_authorized and not claims_known and _claims_needed(query):
            skipped.append(f"{step.__name__} (user_claims: claims are not in the audit log)")
            continue
        try:
            step(query)
        except GatewayError as err:
            return Verdict("refuse", err.reason, step.__name__, err.message, tuple(skipped))
    try:
        skipped += _conditions(query, registry, payload, claims_known)
    except ConditionNotMet as err:
        return Verdict("refuse", err.reason, CONDITIONS_STEP, err.message, tuple(skipped))
    return Verdict("allow", "OK", skipped=tuple(skipped))


def _claims_needed(query: PolicyQuery) -> bool:
    grant = query.grant
    return grant is not None and bool(grant.user_claims) and query.user is not None


def _conditions(
    query: PolicyQuery,
    registry: CapabilityRegistry | None,
    payload: Mapping[str, Any] | None,
    claims_known: bool,
) -> list[str]:
    """Evaluate the grant's conditions that can be judged; the names of those that cannot.

    Raises:
        ConditionNotMet: the first judged condition that is not true.
    """
    grant = query.grant
    if grant is None or not grant.when:
        return []
    if registry is None or not claims_known:
        why = "needs --config" if registry is None else "claims and input are not in the audit log"
        return [f"{CONDITIONS_STEP} ({why})"]
    facts = query.facts(payload)
    skipped = []
    for name, expression in grant.when:
        if payload is None and uses_input(expression):
            skipped.append(f"{CONDITIONS_STEP} ({name}: needs --input)")
            continue
        met, why = holds(expression, facts)
        if not met:
            raise ConditionNotMet(f"condition {name} not met ({why})")
    return skipped


def recorded_user(record: AuditRecord) -> OnBehalfOf | None:
    """The user ``record``'s call acted for (its subject and actors; no claims), if any."""
    if not record.on_behalf_of:
        return None
    try:
        actors = json.loads(record.actor_chain or "[]")
    except ValueError:
        actors = []
    chain = tuple(str(a) for a in actors) if isinstance(actors, list) else ()
    return OnBehalfOf.of(record.on_behalf_of, "", {"sub": record.on_behalf_of}, chain)


@dataclass(frozen=True, slots=True)
class ChangedCall:
    """One recorded call whose policy decision the candidate changes."""

    record: AuditRecord
    before: str
    after: Verdict

    @property
    def tentative(self) -> bool:
        """Allowed only by the steps judged: a skipped step might still refuse it."""
        return self.after.decision == "allow" and bool(self.after.skipped)

    @property
    def direction(self) -> str:
        """``allowed → refused`` or ``refused → allowed`` (marked when tentative)."""
        arrow = f"{_past(self.before)} → {_past(self.after.decision)}"
        return f"{arrow} (version/risk not judged)" if self.tentative else arrow


@dataclass(slots=True)
class BacktestReport:
    """Every change the candidate makes, and what was and was not re-decided.

    Attributes:
        changes: Calls whose decision changes, in log order.
        considered: Records re-decided.
        not_policy: Records left alone (not a policy decision; see the module doc).
        not_judged: Recorded refusals by a skipped step that the judged steps
            would let through (their outcome needs the registry).
        skipped_steps: Steps not run for want of a registry.
    """

    changes: list[ChangedCall] = field(default_factory=list)
    considered: int = 0
    not_policy: int = 0
    not_judged: int = 0
    skipped_steps: tuple[str, ...] = ()

    def groups(self) -> dict[tuple[str, str, str], list[ChangedCall]]:
        """Changes by (peer, capability, direction), in first-seen order."""
        grouped: dict[tuple[str, str, str], list[ChangedCall]] = {}
        for change in self.changes:
            key = (change.record.peer_id, change.record.capability, change.direction)
            grouped.setdefault(key, []).append(change)
        return grouped


def recorded_policy_decision(record: AuditRecord) -> str | None:
    """``allow``/``refuse`` if the policy decided ``record``'s call, else None.

    An allowed call counts once: by its ``OK`` outcome record, never by the
    write-ahead ``ADMITTED`` record. Other ``allow`` records are left alone,
    as the module doc says: failures after the policy (``INVALID_INPUT``,
    ``IDEMPOTENCY_IN_DOUBT``, a capability's error, ``CANCELLED``) and records
    no peer's call made (an operator's idempotency resolution, a person's
    approval).
    """
    if not record.capability or not record.peer_id:
        return None
    if record.decision == "allow":
        return "allow" if record.reason == SERVED else None
    return "refuse" if record.reason in POLICY_REASONS else None


def backtest(
    records: Iterable[AuditRecord], candidate: Policy, registry: CapabilityRegistry | None
) -> BacktestReport:
    """Re-decide every policy decision in ``records`` under ``candidate``."""
    report = BacktestReport(skipped_steps=tuple(sorted(REGISTRY_STEPS)) if registry is None else ())
    for record in records:
        before = recorded_policy_decision(record)
        if before is None:
            report.not_policy += 1
            continue
        try:
            constraint = VersionConstraint.parse(record.version_constraint)
        except VersionSyntaxError:
            report.not_policy += 1
            continue
        report.considered += 1
        after = decide(
            candidate,
            registry,
            peer_id=record.peer_id,
            capability=record.capability,
            constraint=constraint,
            payload_size=record.payload_size,
            now=datetime.fromtimestamp(record.time_unix_ms / 1000, tz=UTC),
            user=recorded_user(record),
            claims_known=False,
        )
        if before == after.decision:
            continue
        if after.decision == "allow" and _STEP_OF_REASON.get(record.reason) in after.skipped:
            report.not_judged += 1
            continue
        report.changes.append(ChangedCall(record, before, after))
    return report


def _past(decision: str) -> str:
    return "allowed" if decision == "allow" else "refused"


def changes_as_json(report: BacktestReport) -> dict[str, object]:
    """The report as exact JSON-ready data (no escaping; the caller serialises)."""
    return {
        "considered": report.considered,
        "not_policy_decisions": report.not_policy,
        "not_judged": report.not_judged,
        "skipped_steps": list(report.skipped_steps),
        "changed": len(report.changes),
        "groups": [
            {
                "peer_id": peer,
                "capability": capability,
                "direction": direction,
                "calls": [_call_json(change) for change in changes],
            }
            for (peer, capability, direction), changes in report.groups().items()
        ],
    }


def _call_json(change: ChangedCall) -> dict[str, object]:
    record = change.record
    return {
        "seq": record.seq,
        "time_unix_ms": record.time_unix_ms,
        "request_id": record.request_id,
        "version_constraint": record.version_constraint,
        "payload_size": record.payload_size,
        "recorded_reason": record.reason,
        "new_reason": change.after.reason,
        "new_step": change.after.step,
        "tentative": change.tentative,
    }


def reasons_in(changes: Sequence[ChangedCall]) -> str:
    """``REASON (step)`` of each distinct new outcome, for a table cell."""
    seen: dict[str, None] = {}
    for change in changes:
        after = change.after
        seen[f"{after.reason} ({after.step})" if after.step else after.reason] = None
    return ", ".join(seen)
