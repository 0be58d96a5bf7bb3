"""Policy before dispatch: small, named, ordered checks that fail closed.

Order (each refusal has its own reason code):

1. ``UNKNOWN_PEER``           no grant for the caller's SPIFFE ID
2. ``GRANT_EXPIRED``          the grant's ``expires_at`` has passed
3. ``CAPABILITY_NOT_GRANTED`` the grant names no such capability (same answer
   whether or not it exists here; the audit detail keeps the truth)
4. ``VERSION_NOT_AVAILABLE``  no local version satisfies both the request and the grant
5. ``RISK_NOT_GRANTED``       the resolved version's risk is above ``max_risk``
6. ``PAYLOAD_TOO_LARGE``      raw payload bytes above the grant's cap

Input validation and the deadline check follow in the dispatcher, because they
need the resolved contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from capabilities.registry import Capability, CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.errors import (
    CapabilityNotGranted,
    GrantExpired,
    PayloadTooLarge,
    RiskNotGranted,
    UnknownPeer,
    VersionNotAvailable,
)
from policies.grants import PeerGrant
from policies.policy_file import Policy


@dataclass(frozen=True, slots=True)
class Admission:
    """A call the policy allows: who, under which grant, served by which version."""

    peer_id: str
    grant: PeerGrant
    capability: Capability


def grant_for(policy: Policy, peer_id: str, now: datetime) -> PeerGrant:
    """Steps 1-2: the caller's live grant.

    Raises:
        UnknownPeer: no grant names ``peer_id``.
        GrantExpired: the grant has expired at ``now``.
    """
    grant = policy.grants.get(peer_id)
    if grant is None:
        raise UnknownPeer("no grant for this peer")
    if now >= grant.expires_at:
        raise GrantExpired(f"grant expired at {grant.expires_at.isoformat()}")
    return grant


def admit(
    policy: Policy,
    registry: CapabilityRegistry,
    *,
    peer_id: str,
    capability: str,
    constraint: VersionConstraint,
    payload_size: int,
    now: datetime,
) -> Admission:
    """Run steps 1-6 in order; return the admission or raise the first refusal."""
    grant = grant_for(policy, peer_id, now)
    entries = grant.entries_for(capability)
    if not entries:
        detail = "not in grant" if registry.has(capability) else "capability not registered"
        raise CapabilityNotGranted("capability not granted to this peer", detail=detail)
    chosen = _highest_granted(
        registry, capability, constraint, [e.version_constraint for e in entries]
    )
    if chosen is None:
        raise VersionNotAvailable(
            f"no version of {capability} matching {constraint} is available to this peer"
        )
    if not grant.allows_risk(chosen.contract.risk):
        raise RiskNotGranted(
            f"{chosen.contract.key} has risk {chosen.contract.risk.value}; "
            f"grant allows up to {grant.max_risk.value if grant.max_risk else 'any'}"
        )
    if payload_size > grant.max_payload_bytes:
        raise PayloadTooLarge(
            f"payload is {payload_size} bytes; this peer's cap is {grant.max_payload_bytes}"
        )
    return Admission(peer_id=peer_id, grant=grant, capability=chosen)


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
    visible: list[Capability] = []
    for cap in registry:
        if not grant.allows_risk(cap.contract.risk):
            continue
        entries = grant.entries_for(cap.name)
        if any(entry.version_constraint.allows(cap.version) for entry in entries):
            visible.append(cap)
    return grant, visible
