"""Where a capability can run: locally, or on an authorized peer that offers it.

Order of routes for a capability: the local registry first, then peers in the
order of the agent's ``[[peers]]``. A peer is a route only if

1. this agent's ``[[outbound]]`` rules allow sending that capability (and
   version) to it — fails closed: no rule, no route; and
2. its ``Describe`` (to this agent) lists a matching version.

Which version a place serves is chosen by one function, ``select_routes``: the
highest version that the step's constraint, the task's risk *and* the outbound
rule all allow. The static check of a plan and the run-time choice both use it,
so a version-scoped rule (``x@^1``) cannot pass one and fail the other.

Descriptions are cached per peer; ``forget(peer)`` drops one when the peer
answers that a capability or version is not available. A peer whose Describe
failed is reported as ``Skipped`` (``PEER_UNAVAILABLE`` when it could not be
reached in time), never silently dropped, and the failure is remembered for a
few seconds so that every step does not wait for it again. Describe never
waits past the caller's deadline. The outbound rule is checked again on every
call, so a policy reload takes effect at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capabilities.canonical import ascii_json
from capabilities.context import PeerCall
from capabilities.contract import Risk
from capabilities.registry import Capability, CapabilityRegistry
from capabilities.versions import Version, VersionConstraint, VersionSyntaxError
from gateway.client.peer_client import InvokeResult, PeerClient, PeerDescription, RemoteCapability
from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    InvalidInput,
    InvalidOutput,
    OutboundNotAllowed,
    PayloadTooLarge,
    PeerUnavailable,
    UserNotAuthorized,
)
from gateway.identity.exchange import ActingFor, TokenExchange
from policies.store import PolicyStore

_log = logging.getLogger(__name__)

LOCAL = "local"
"""The ``where`` of a route that runs in this agent."""


@dataclass(frozen=True, slots=True)
class Offer:
    """One place a capability version can run.

    Attributes:
        capability: Capability name.
        version: The version that would serve.
        risk: Its risk.
        idempotent: Whether it is marked idempotent.
        where: ``"local"`` or the peer's SPIFFE ID.
        input_fields: Top-level input fields the contract declares (all that may be sent).
        output_schema: JSON Schema of the output (remote outputs are checked against it).
        max_payload_bytes: The peer's advertised payload cap (None for local).
        local: The local capability, when ``where`` is ``"local"``.
        timeout_seconds: The peer's advertised contract timeout (None for local, or
            if the peer advertised none): bounds one attempt there.
        input_schema: JSON Schema of the input: inside the declared fields, only what
            it declares is sent (``gateway.plans.execution.minimise``).
    """

    capability: str
    version: Version
    risk: Risk
    idempotent: bool
    where: str
    input_fields: frozenset[str]
    output_schema: dict[str, Any]
    max_payload_bytes: int | None = None
    local: Capability | None = None
    timeout_seconds: float | None = None
    input_schema: dict[str, Any] = field(default_factory=dict)

    @property
    def retryable(self) -> bool:
        """Read capabilities and idempotent ones may be retried."""
        return self.risk is Risk.READ or self.idempotent


@dataclass(frozen=True, slots=True)
class Skipped:
    """A peer that was not a route, and why (reason code only)."""

    where: str
    reason: str

    @property
    def unreachable(self) -> bool:
        """The peer could not be asked what it offers (it may be back soon)."""
        return self.reason == PeerUnavailable.reason


OfferFilter = Callable[[Offer], bool]
"""Whether an offer may be used (e.g. the outbound rules allow its version)."""


def _any_offer(offer: Offer) -> bool:
    return True


def select_routes(
    offers: Iterable[Offer],
    constraint: VersionConstraint,
    *,
    avoid: Sequence[str] = (),
    max_risk: Risk | None = None,
    permitted: OfferFilter = _any_offer,
) -> list[Offer]:
    """One offer per place, places in the order they first appear in ``offers``.

    For each place the highest version that ``constraint``, ``max_risk`` and
    ``permitted`` all allow: filtering first and taking the highest after, so a
    rule allowing only some versions still gets the best of those. Places in
    ``avoid`` and places with no such version are left out.
    """
    best: dict[str, Offer] = {}
    for offer in offers:
        if offer.where in avoid or not constraint.allows(offer.version):
            continue
        if max_risk is not None and offer.risk.rank > max_risk.rank:
            continue
        if not permitted(offer):
            continue
        current = best.get(offer.where)
        if current is None or offer.version > current.version:
            best[offer.where] = offer
    return list(best.values())


def local_offer(cap: Capability) -> Offer:
    """The offer of a capability registered in this agent."""
    contract = cap.contract
    return Offer(
        capability=contract.name,
        version=contract.version,
        risk=contract.risk,
        idempotent=contract.idempotent,
        where=LOCAL,
        input_fields=contract.input_fields(),
        output_schema=contract.output_schema(),
        local=cap,
        input_schema=contract.input_schema(),
    )


def remote_offer(peer_id: str, cap: RemoteCapability, max_payload_bytes: int) -> Offer | None:
    """The offer a peer's description makes (None if it is malformed: fail closed)."""
    try:
        version = Version.parse(cap.version)
        risk = Risk(cap.risk)
    except (VersionSyntaxError, ValueError):
        return None
    if not isinstance(cap.input_schema, dict) or not isinstance(cap.output_schema, dict):
        return None  # JSON, but not a schema object: nothing to minimise or check against
    properties = cap.input_schema.get("properties", {})
    return Offer(
        capability=cap.name,
        version=version,
        risk=risk,
        idempotent=cap.idempotent,
        where=peer_id,
        input_fields=frozenset(properties) if isinstance(properties, dict) else frozenset(),
        output_schema=cap.output_schema,
        max_payload_bytes=max_payload_bytes,
        timeout_seconds=cap.timeout_seconds if cap.timeout_seconds > 0 else None,
        input_schema=cap.input_schema,
    )


class Router:
    """Finds offers for capabilities and sends calls to peers, policy first."""

    def __init__(
        self,
        *,
        registry: CapabilityRegistry,
        policies: PolicyStore,
        peers: Sequence[str],
        client_for: Callable[[str], PeerClient],
        describe_timeout: float = 3.0,
        cache_seconds: float = 300.0,
        failure_memory_seconds: float = 5.0,
        exchange: TokenExchange | None = None,
    ) -> None:
        self._exchange = exchange
        self._registry = registry
        self._policies = policies
        self._peers = tuple(peers)
        self._client_for = client_for
        self._describe_timeout = describe_timeout
        self._cache_seconds = cache_seconds
        self._failure_memory_seconds = failure_memory_seconds
        self._described: dict[str, tuple[float, PeerDescription]] = {}
        self._failed: dict[str, tuple[float, Skipped]] = {}

    def may_send(self, peer_id: str, capability: str, version: Version | None = None) -> bool:
        """The outbound rules allow ``capability`` (at ``version``) to ``peer_id``."""
        rule = self._policies.current.outbound.get(peer_id)
        if rule is None:
            return False
        return any(
            entry.name == capability
            and (version is None or entry.version_constraint.allows(version))
            for entry in rule.capabilities
        )

    def permits(self, offer: Offer) -> bool:
        """The offer runs locally, or the outbound rules allow its capability and version
        to its peer (the filter for ``select_routes``)."""
        return offer.where == LOCAL or self.may_send(offer.where, offer.capability, offer.version)

    def has_local(self, capability: str, constraint: VersionConstraint) -> bool:
        """True if this agent's registry can run ``capability@constraint``."""
        return self._registry.resolve(capability, constraint) is not None

    async def offers(
        self,
        capability: str,
        constraint: VersionConstraint,
        *,
        avoid: Sequence[str] = (),
        deadline: float | None = None,
        max_risk: Risk | None = None,
    ) -> tuple[list[Offer], list[Skipped]]:
        """Routes for ``capability@constraint``: local first, then peers in config order.

        Each route serves the version ``select_routes`` picks (within ``max_risk``
        if given). Peers not asked (outbound rules), whose Describe failed (before
        ``deadline``, a ``time.monotonic()`` value) or whose matching versions the
        outbound rules all refuse come back as ``Skipped``.
        """
        skipped: list[Skipped] = []
        candidates = [peer for peer in self._peers if peer not in avoid]
        allowed = [peer for peer in candidates if self.may_send(peer, capability)]
        skipped += [
            Skipped(peer, OutboundNotAllowed.reason) for peer in candidates if peer not in allowed
        ]
        descriptions, failed = await self._describe_all(allowed, deadline)
        skipped += failed
        remote = [
            offer
            for peer in allowed
            if peer in descriptions
            for offer in _offers_of(descriptions[peer], capability)
        ]
        local = [local_offer(c) for c in self._registry if c.name == capability]
        found = select_routes(
            local + remote, constraint, avoid=avoid, max_risk=max_risk, permitted=self.permits
        )
        routed = {offer.where for offer in found}
        for peer in allowed:
            offered = select_routes(_offers_of(descriptions.get(peer), capability), constraint)
            if offered and peer not in routed and (max_risk is None or _within(offered, max_risk)):
                skipped.append(Skipped(peer, OutboundNotAllowed.reason))
        return found, skipped

    async def catalog(
        self, names: Sequence[str], *, deadline: float | None = None
    ) -> tuple[dict[str, list[Offer]], dict[str, list[Skipped]]]:
        """Every offer (any version) for each capability in ``names`` that ``permits``
        allows, and the peers the outbound rules allow for it whose Describe failed."""
        result: dict[str, list[Offer]] = {}
        skipped: dict[str, list[Skipped]] = {}
        for name in sorted(set(names)):
            local = [local_offer(c) for c in self._registry if c.name == name]
            allowed = [peer for peer in self._peers if self.may_send(peer, name)]
            descriptions, skipped[name] = await self._describe_all(allowed, deadline)
            remote = [
                offer
                for peer in allowed
                if peer in descriptions
                for offer in _offers_of(descriptions[peer], name)
                if self.permits(offer)
            ]
            result[name] = local + remote
        return result, skipped

    def forget(self, peer_id: str) -> None:
        """Drop the cached description of ``peer_id`` (it will be asked again)."""
        self._described.pop(peer_id, None)
        self._failed.pop(peer_id, None)

    async def _describe_all(
        self, peers: Sequence[str], deadline: float | None
    ) -> tuple[dict[str, PeerDescription], list[Skipped]]:
        answers = await asyncio.gather(*(self._describe(peer, deadline) for peer in peers))
        found: dict[str, PeerDescription] = {}
        failed: list[Skipped] = []
        for peer, answer in zip(peers, answers, strict=True):
            if isinstance(answer, Skipped):
                failed.append(answer)
            else:
                found[peer] = answer
        return found, failed

    async def _describe(self, peer_id: str, deadline: float | None) -> PeerDescription | Skipped:
        now = time.monotonic()
        cached = self._described.get(peer_id)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        failed = self._failed.get(peer_id)
        if failed is not None and now - failed[0] < self._failure_memory_seconds:
            return failed[1]
        timeout = (
            self._describe_timeout
            if deadline is None
            else min(self._describe_timeout, deadline - now)
        )
        if timeout <= 0:
            return Skipped(peer_id, PeerUnavailable.reason)  # not asked: not remembered
        try:
            description = await self._client_for(peer_id).describe(timeout=timeout)
        except GatewayError as err:
            _log.info(
                "describe %s failed: %s",
                peer_id,
                err.reason,
                extra={"peer": peer_id, "reason": err.reason},
            )
            if not err.transient:  # an answer (a refusal): quick to ask again
                return Skipped(peer_id, err.reason)
            skipped = Skipped(peer_id, PeerUnavailable.reason)
            # A Describe cut short by the caller's deadline says little about the peer.
            if timeout >= self._describe_timeout or not isinstance(err, DeadlineExceeded):
                self._failed[peer_id] = (time.monotonic(), skipped)
            return skipped
        if description.agent_id != peer_id:
            # Its handshake proved it is peer_id; its words cannot make that an
            # identity mismatch (only our TLS check says so), just a bad answer.
            _log.warning(
                "peer %s described itself as someone else; ignored",
                peer_id,
                extra={"peer": peer_id, "reason": InvalidOutput.reason},
            )
            return Skipped(peer_id, InvalidOutput.reason)
        self._failed.pop(peer_id, None)
        self._described[peer_id] = (time.monotonic(), description)
        return description

    async def send(
        self,
        offer: Offer,
        payload: dict[str, Any],
        *,
        timeout: float,
        request_id: str,
        task_id: str = "",
        step_id: str = "",
        idempotency_key: str = "",
        acting_for: ActingFor | None = None,
    ) -> InvokeResult:
        """Send exactly ``payload`` to the offer's peer, after the outbound and size checks.

        ``acting_for``: the user the call acts for; the peer gets a token for
        that user made for it (:meth:`user_token`), or nothing is sent.
        """
        if offer.where == LOCAL or not self.may_send(offer.where, offer.capability, offer.version):
            raise OutboundNotAllowed(f"outbound rules do not allow {offer.capability} to this peer")
        body = encode_payload(payload)
        if offer.max_payload_bytes is not None and len(body) > offer.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {len(body)} bytes; the peer accepts {offer.max_payload_bytes}"
            )
        user_token = await self.user_token(acting_for, offer.where)
        return await self._client_for(offer.where).invoke(
            offer.capability,
            body,
            constraint=f"={offer.version}",
            timeout=timeout,
            request_id=request_id,
            task_id=task_id,
            step_id=step_id,
            idempotency_key=idempotency_key,
            user_token=user_token,
        )

    async def user_token(self, acting_for: ActingFor | None, peer_id: str) -> str:
        """The token carrying ``acting_for``'s user to ``peer_id`` ("" for a call for no user).

        Raises:
            UserNotAuthorized: the user cannot be carried there (nothing is sent).
        """
        if acting_for is None:
            return ""
        if self._exchange is None:
            raise UserNotAuthorized(
                "this call acts for a user, and this agent takes no tokens to carry the "
                "user onward ([identity.tokens]); nothing was sent"
            )
        return await self._exchange.token_for(acting_for, peer_id)

    def bind(
        self, deadline: float, task_id: str, step_id: str, acting_for: ActingFor | None = None
    ) -> PeerCall:
        """A ``CallContext.call_peer`` for one call: its deadline bounds every peer call, and
        every peer call acts for its user (``acting_for``), if it has one."""

        async def call_peer(
            peer_id: str, capability: str, payload: dict[str, Any], *, constraint: str = ""
        ) -> Any:
            return await self.call_for_capability(
                peer_id,
                capability,
                payload,
                constraint=constraint,
                deadline=deadline,
                task_id=task_id,
                step_id=step_id,
                acting_for=acting_for,
            )

        return call_peer

    async def call_for_capability(
        self,
        peer_id: str,
        capability: str,
        payload: dict[str, Any],
        *,
        constraint: str,
        deadline: float,
        task_id: str,
        step_id: str,
        acting_for: ActingFor | None = None,
    ) -> Any:
        """A call made from inside a capability: outbound rules apply; the deadline carries on,
        and so does the user the call acts for."""
        if not self.may_send(peer_id, capability):
            raise OutboundNotAllowed(f"outbound rules do not allow {capability} to this peer")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("no time left to call a peer")
        user_token = await self.user_token(acting_for, peer_id)
        result = await self._client_for(peer_id).invoke(
            capability,
            encode_payload(payload),
            constraint=constraint,
            timeout=max(0.001, deadline - time.monotonic()),
            task_id=task_id,
            step_id=step_id,
            user_token=user_token,
        )
        return result.output()


def encode_payload(payload: dict[str, Any]) -> bytes:
    """Compact JSON bytes of ``payload``; InvalidInput if it is not JSON."""
    try:
        return ascii_json(payload, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise InvalidInput(f"payload is not JSON-serialisable: {type(err).__name__}") from err


def _offers_of(description: PeerDescription | None, capability: str) -> list[Offer]:
    """Every well-formed offer of ``capability`` in ``description``, any version."""
    if description is None:
        return []
    found = []
    for cap in description.capabilities:
        if cap.name == capability:
            offer = remote_offer(description.agent_id, cap, description.max_payload_bytes)
            if offer is not None:
                found.append(offer)
    return found


def _within(offers: Sequence[Offer], max_risk: Risk) -> bool:
    return any(offer.risk.rank <= max_risk.rank for offer in offers)
