"""Policy before dispatch: small, named, ordered checks that fail closed.

Order (each refusal has its own reason code):

1. ``UNKNOWN_PEER``           no grant for the caller's SPIFFE ID
2. ``GRANT_EXPIRED``          the grant's ``expires_at`` has passed
3. ``CAPABILITY_NOT_GRANTED`` the grant names no such capability (same answer
   whether or not it exists here; the audit detail keeps the truth)
4. ``VERSION_NOT_AVAILABLE``  no local version satisfies both the request and the grant
5. ``RISK_NOT_GRANTED``       the resolved version's risk is above ``max_risk``
6. ``PAYLOAD_TOO_LARGE``      raw payload bytes above the grant's cap
7. ``USER_NOT_AUTHORIZED``    the grant needs a user (``users``, ``user_claims``) the
   call does not carry, or whose claims do not match

Then, once the input is valid (the pipeline runs it after ``valid_input``):

8. ``CONDITION_NOT_MET``      a condition of the grant (``when``) is not true

Each step is a small named function over a ``PolicyQuery``; ``POLICY_STEPS``
lists them in order. The whole inbound order (identity and request checks
before them, replay, input and deadline after) is written once, in
``gateway.inbound.pipeline``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from capabilities.registry import Capability, CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.errors import (
    CapabilityNotGranted,
    ConditionNotMet,
    GrantExpired,
    PayloadTooLarge,
    RiskNotGranted,
    UnknownPeer,
    UserNotAuthorized,
    VersionNotAvailable,
)
from policies.conditions import CallFacts, holds
from policies.grants import CapabilityGrant, PeerGrant
from policies.policy_file import Policy
from policies.users import OnBehalfOf, claims_match


# Final fields, not frozen: see CONTRIBUTING.md, "Value classes built per call".
@dataclass(slots=True, unsafe_hash=True)
class Admission:
    """A call the policy allows: who, for whom, under which grant, served by which version."""

    peer_id: Final[str]
    grant: Final[PeerGrant]
    capability: Final[Capability]
    user: Final[OnBehalfOf | None] = None


_NO_CAPABILITIES = CapabilityRegistry()
_ANY_VERSION = VersionConstraint.parse("")


def grant_for(policy: Policy, peer_id: str, now: datetime) -> PeerGrant:
    """Steps 1-2: the caller's live grant.

    Raises:
        UnknownPeer: no grant names ``peer_id``.
        GrantExpired: the grant has expired at ``now``.
    """
    query = PolicyQuery(policy, _NO_CAPABILITIES, peer_id, "", _ANY_VERSION, 0, now)
    known_peer(query)
    grant_live(query)
    assert query.grant is not None
    return query.grant


@dataclass(slots=True)
class PolicyQuery:
    """One call as the policy steps see it; each step reads it and may fill in a field.

    Attributes:
        policy: The policy in force for this call (one snapshot for every step).
        registry: The agent's capabilities.
        peer_id: The caller's SPIFFE ID (proven by its certificate).
        capability: Requested capability name.
        constraint: Requested version constraint.
        payload_size: Raw payload bytes.
        now: The decision time.
        grant: Set by ``known_peer``.
        chosen: Set by ``version_available``.
        entries: The grant's entries naming the capability, set by
            ``capability_granted`` (read again by ``version_available``).
        user: The verified user the call acts for (None: none).
    """

    policy: Policy
    registry: CapabilityRegistry
    peer_id: str
    capability: str
    constraint: VersionConstraint
    payload_size: int
    now: datetime
    grant: PeerGrant | None = None
    chosen: Capability | None = None
    entries: tuple[CapabilityGrant, ...] | None = None
    user: OnBehalfOf | None = None

    def admission(self) -> Admission:
        """The admission, once every step has passed."""
        assert self.grant is not None and self.chosen is not None
        return Admission(self.peer_id, self.grant, self.chosen, self.user)

    def facts(self, payload: Mapping[str, Any] | None) -> CallFacts:
        """What the grant's conditions read, once a version is chosen (``payload``: the
        validated input's declared fields; None where it is not known)."""
        assert self.chosen is not None
        user = self.user
        return CallFacts(
            caller=self.peer_id,
            user={} if user is None else user.claims,
            actors=() if user is None else user.actors,
            capability=self.capability,
            version=str(self.chosen.version),
            risk=self.chosen.contract.risk.value,
            time=self.now,
            input=payload,
        )


def known_peer(query: PolicyQuery) -> None:
    """Step 1: some grant names the caller (``UNKNOWN_PEER``)."""
    query.grant = query.policy.grants.get(query.peer_id)
    if query.grant is None:
        raise UnknownPeer("no grant for this peer")


def grant_live(query: PolicyQuery) -> None:
    """Step 2: the grant has not expired (``GRANT_EXPIRED``)."""
    assert query.grant is not None
    if query.now >= query.grant.expires_at:
        raise GrantExpired(f"grant expired at {query.grant.expires_at.isoformat()}")


def capability_granted(query: PolicyQuery) -> None:
    """Step 3: the grant names the capability (``CAPABILITY_NOT_GRANTED``).

    The same answer whether or not the capability exists here; ``detail``
    (audit only) keeps which.
    """
    assert query.grant is not None
    query.entries = query.grant.entries_for(query.capability)
    if not query.entries:
        exists = query.registry.has(query.capability)
        detail = "not in grant" if exists else "capability not registered"
        raise CapabilityNotGranted("capability not granted to this peer", detail=detail)


def version_available(query: PolicyQuery) -> None:
    """Step 4: the highest version request and grant allow (``VERSION_NOT_AVAILABLE``)."""
    assert query.grant is not None
    entries = query.entries
    if entries is None:  # run on its own (tests): not after capability_granted
        entries = query.grant.entries_for(query.capability)
    query.chosen = _highest_granted(
        query.registry,
        query.capability,
        query.constraint,
        [entry.version_constraint for entry in entries],
    )
    if query.chosen is None:
        raise VersionNotAvailable(
            f"no version of {query.capability} matching {query.constraint} "
            "is available to this peer"
        )


def risk_within_grant(query: PolicyQuery) -> None:
    """Step 5: the chosen version's risk is within ``max_risk`` (``RISK_NOT_GRANTED``)."""
    assert query.grant is not None and query.chosen is not None
    grant, contract = query.grant, query.chosen.contract
    if not grant.allows_risk(contract.risk):
        raise RiskNotGranted(
            f"{contract.key} has risk {contract.risk.value}; "
            f"grant allows up to {grant.max_risk.value if grant.max_risk else 'any'}"
        )


def payload_within_cap(query: PolicyQuery) -> None:
    """Step 6: raw payload bytes within the grant's cap (``PAYLOAD_TOO_LARGE``)."""
    assert query.grant is not None
    cap = query.grant.max_payload_bytes
    if query.payload_size > cap:
        raise PayloadTooLarge(f"payload is {query.payload_size} bytes; this peer's cap is {cap}")


def user_authorized(query: PolicyQuery) -> None:
    """Step 7: the user the grant needs is there, with its claims (``USER_NOT_AUTHORIZED``)."""
    assert query.grant is not None
    grant = query.grant
    if not grant.needs_user:
        return
    if query.user is None:
        raise UserNotAuthorized("this grant needs a user the call acts for; none was sent")
    missing = claims_match(query.user.claims, dict(grant.user_claims))
    if missing is not None:
        raise UserNotAuthorized(
            f"the user does not have the claim {missing} this grant needs",
            detail=f"user {query.user.subject}: claim {missing}",
        )


def conditions_met(query: PolicyQuery, payload: Mapping[str, Any] | None) -> None:
    """Step 8: every condition of the grant is true (``CONDITION_NOT_MET`` names the first
    that is not; its detail says why: false, or an evaluation error's kind)."""
    assert query.grant is not None
    if not query.grant.when:
        return
    facts = query.facts(payload)
    for name, expression in query.grant.when:
        met, why = holds(expression, facts)
        if not met:
            raise ConditionNotMet(f"condition {name} not met", detail=f"{name}: {why}")


PolicyStep = Callable[[PolicyQuery], None]

POLICY_STEPS: tuple[PolicyStep, ...] = (
    known_peer,
    grant_live,
    capability_granted,
    version_available,
    risk_within_grant,
    payload_within_cap,
    user_authorized,
)
"""Steps 1-7, in order; the first to raise answers the call (step 8, the conditions,
needs the valid input: :func:`conditions_met`)."""


def admit(
    policy: Policy,
    registry: CapabilityRegistry,
    *,
    peer_id: str,
    capability: str,
    constraint: VersionConstraint,
    payload_size: int,
    now: datetime,
    user: OnBehalfOf | None = None,
    payload: Mapping[str, Any] | None = None,
) -> Admission:
    """Run steps 1-8 in order; return the admission or raise the first refusal.

    ``payload``: the input's declared fields for the conditions (None: a
    condition that reads ``input`` fails to evaluate, so it is not met).
    """
    query = PolicyQuery(policy, registry, peer_id, capability, constraint, payload_size, now)
    query.user = user
    for step in POLICY_STEPS:
        step(query)
    conditions_met(query, payload)
    return query.admission()


def _highest_granted(
    registry: CapabilityRegistry,
    name: str,
    requested: VersionConstraint,
    granted: list[VersionConstraint],
) -> Capability | None:
    best: Capability | None = None
    for grant_constraint in granted:
        found = registry.resolve(name, requested, also=grant_constraint)
        if found is not None and (best is None or found.version > best.version):
            best = found
    return best


def callable_capabilities(
    policy: Policy, registry: CapabilityRegistry, peer_id: str, now: datetime
) -> tuple[PeerGrant, list[Capability]]:
    """What ``peer_id`` may call here (for Describe); refuses like ``admit``."""
    grant = grant_for(policy, peer_id, now)
    return grant, visible_capabilities(grant, registry)


def visible_capabilities(grant: PeerGrant, registry: CapabilityRegistry) -> list[Capability]:
    """Every local capability version ``grant`` allows, name, version and risk."""
    visible: list[Capability] = []
    for cap in registry:
        if not grant.allows_risk(cap.contract.risk):
            continue
        entries = grant.entries_for(cap.name)
        if any(entry.version_constraint.allows(cap.version) for entry in entries):
            visible.append(cap)
    return visible
