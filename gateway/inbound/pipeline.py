"""The one decision path every inbound call takes, whatever protocol carried it.

An ordered list of named checks, written once; the first to raise answers the
call and nothing after it runs::

    audit_available        AUDIT_UNAVAILABLE   the log can record (fails closed)
    identity               UNAUTHENTICATED     exactly one SPIFFE ID in the verified cert;
                           TOKEN_*             with [identity.tokens], the bearer tokens
                                               beside or instead of it, and the user one
                                               (``gateway.identity.callers``)
    no_claimed_identity    UNAUTHENTICATED     the request names no caller itself (an A2A
                                               metadata key such as ``a2agw.peer``)
    well_formed_request    INVALID_REQUEST     parsable request, request id, no control or
                                               bidi characters, deadline sign, constraint
    known_peer             UNKNOWN_PEER        policy step 1
    grant_live             GRANT_EXPIRED       policy step 2
    within_limits          RATE_LIMITED        the peer's rate (token bucket), its
                           CONCURRENCY_LIMITED calls in flight, the server's cap on calls
                           SERVER_BUSY         (takes a slot the handler gives back when
                                               the call ends, whatever happens; adopts
                                               the one the HTTP edge took, see EdgeSlot)
    capability_granted     CAPABILITY_NOT_GRANTED  policy step 3
    version_available      VERSION_NOT_AVAILABLE   policy step 4
    risk_within_grant      RISK_NOT_GRANTED    policy step 5
    payload_within_cap     PAYLOAD_TOO_LARGE   policy step 6 (an A2A message: all its parts)
    user_authorized        USER_NOT_AUTHORIZED policy step 7: the user the grant needs
    parts_accepted         CONTENT_TYPE_NOT_SUPPORTED  an A2A message's parts are of kinds and
                           INVALID_REQUEST     media types the chosen version accepts, no more
                           INVALID_INPUT       of them than it takes (text for a contract
                                               taking no text: as before this check);
                                               a call of one JSON object (Invoke, MCP, a
                                               plan step) is one data part
    payload_decoded        INVALID_REQUEST     a payload the transport measured but did not
                           INVALID_INPUT       decode yet (an A2A ``data`` or ``text`` part)
                           PAYLOAD_TOO_LARGE   becomes JSON, which must be within the cap too
    first_sighting         REPLAYED_REQUEST    request id not seen from this peer
    valid_input            INVALID_INPUT       payload matches the input contract (a
                                               follow-up's: the schema it answers)
    conditions_met         CONDITION_NOT_MET   policy step 8: the grant's CEL conditions
                                               over the caller, user and valid input
    deadline_ahead         DEADLINE_EXCEEDED   the deadline has not already passed

``Describe`` (and every A2A method that names no capability: the agent card,
the task reads) runs the prefix that makes sense without a capability:
``audit_available``, ``identity``, ``known_peer``, ``grant_live``,
``within_limits``. Nothing of a payload is decoded before ``payload_decoded``,
so a caller without a grant, over its limits or over its cap costs no CPU that
grows with what it sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from functools import lru_cache

from pydantic import BaseModel, ValidationError

from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.audit import AuditLog
from gateway.display import has_unsafe_characters
from gateway.errors import (
    AuditUnavailable,
    ContentTypeNotSupported,
    DeadlineExceeded,
    InvalidInput,
    InvalidRequest,
    ReplayedRequest,
    Unauthenticated,
)
from gateway.identity import PresentedTokens, TokenIdentities
from gateway.inbound.call import REQUEST_ID, InvokeCall
from gateway.inbound.limits.admission import AdmissionControl, CallSlot
from gateway.inbound.replay.store import ReplayWindow
from policies.decisions import (
    POLICY_STEPS,
    Admission,
    PolicyQuery,
    conditions_met,
    grant_live,
    known_peer,
    payload_within_cap,
)
from policies.identity import peer_certificate
from policies.store import PolicyStore
from policies.users import OnBehalfOf

_ANY_VERSION = VersionConstraint.parse("")
_NAMED_TEXTS = ("capability", "version_constraint", "task_id", "step_id", "idempotency_key")
"""The call's names and ids checked for control or bidi characters, as refusals name them."""
_log = logging.getLogger(__name__)


class InFlight(Enum):
    """How a call counts against its peer's ``max_in_flight`` (step 2a)."""

    ROOM = "room"
    """Needs a free place (every call, Describe, the card); a read gives it back at once."""
    POLL = "poll"
    """A read of the peer's own tasks: rate-limited, needs no free place."""
    HOLD = "hold"
    """A subscription: needs a free place and holds it while open."""


@dataclass(slots=True)
class EdgeSlot:
    """A request's limit slot, taken by a transport's edge before it read the request.

    The HTTP edge cannot parse a body before its limits hold, so it takes the
    slot first (one token of the peer's rate; a place of ``kind``, POLL when
    the method is not known yet) and hands it over with the request.
    ``within_limits`` adopts it instead of taking a second token; from then on
    the slot is the pipeline's, released as any other. Until then (refused
    earlier, never reached) the edge gives it back: :meth:`release_unless_adopted`.

    Attributes:
        slot: The places taken.
        kind: How they were taken (POLL: without room under ``max_in_flight``).
        adopted: Set once ``within_limits`` took the slot over.
    """

    slot: CallSlot
    kind: InFlight
    adopted: bool = False

    def release_unless_adopted(self) -> None:
        """The edge's end of the request: give the slot back unless the pipeline owns it."""
        if not self.adopted:
            self.slot.release()


@dataclass(slots=True)
class Inbound:
    """What the checks learn about one call as it passes them.

    Attributes:
        call: The call as the transport delivered it (with its pending payload
            decoded, once ``payload_decoded`` has run).
        peer_id: Set by ``identity``.
        query: The policy steps' view of the call (set by ``well_formed_request``
            or, for Describe, by ``identity``).
        payload: The validated input model, set by ``valid_input``.
        slot: The call's in-flight places, set by ``within_limits``; whoever
            holds the Inbound after a refusal or the call's end releases it.
        in_flight: How the call counts against the peer's ``max_in_flight``.
        edge_slot: A slot the transport took before reading the request, for
            ``within_limits`` to adopt (HTTP); None: it takes one.
        user: The verified user the call acts for, set by ``identity`` (None: none).
    """

    call: InvokeCall
    peer_id: str = ""
    user: OnBehalfOf | None = None
    query: PolicyQuery | None = None
    payload: BaseModel | None = None
    slot: CallSlot | None = None
    in_flight: InFlight = InFlight.ROOM
    edge_slot: EdgeSlot | None = None

    @property
    def admission(self) -> Admission:
        """The policy's admission (after every policy step has passed)."""
        assert self.query is not None
        return self.query.admission()


Check = Callable[["DecisionPipeline", Inbound], Awaitable[None] | None]
"""A check raises its refusal; one that asks shared state (the replay window) is async."""


PeerIssuerCheck = Callable[[bytes, str], None]
"""Raises Unauthenticated unless the certificate was issued within its SPIFFE ID's own
trust domain (``LiveTls.check_peer_issuer``: matters once bundles of several domains are
trusted at once)."""


@dataclass(frozen=True, slots=True)
class NamedCheck:
    """One step of the decision path: its name (logs, docs, tests) and function."""

    name: str
    run: Check


def peer_id_from_cert(pem: bytes | None) -> str:
    """The caller's SPIFFE ID from its verified certificate, valid now; Unauthenticated
    otherwise.

    Whatever a certificate does to the parser, the caller is only ever
    unauthenticated: an exception of any other type is logged as one line
    (its type only, never certificate content or a traceback) and refused, so
    it cannot escape as an unaudited UNKNOWN on any protocol. The TLS stack
    checked the validity at the handshake only; a connection may outlive it.
    """
    if not pem:
        raise Unauthenticated("no verified client certificate")
    try:
        certificate = peer_certificate(pem)
    except Unauthenticated:
        raise
    except Exception as err:
        _log.warning(
            "peer certificate unreadable (%s); refused as UNAUTHENTICATED",
            type(err).__name__,
            extra={"reason": Unauthenticated.reason},
        )
        raise Unauthenticated(
            "peer certificate could not be read",
            detail=f"unreadable certificate ({type(err).__name__})",
        ) from err
    now = time.time()
    if now > certificate.not_after:
        raise Unauthenticated(
            "peer certificate has expired (after this connection was made)",
            detail="certificate expired on an open connection",
        )
    if now < certificate.not_before:  # the handshake's clock disagreed: still refused
        raise Unauthenticated("peer certificate is not valid yet")
    return certificate.spiffe_id


class DecisionPipeline:
    """Runs the ordered checks for one agent; transport servicers call only this."""

    def __init__(
        self,
        *,
        registry: CapabilityRegistry,
        policies: PolicyStore,
        audit: AuditLog,
        replay: ReplayWindow,
        limits: AdmissionControl,
        peer_issuer: PeerIssuerCheck | None = None,
        tokens: TokenIdentities | None = None,
    ) -> None:
        self._registry = registry
        self._policies = policies
        self._audit = audit
        self._replay = replay
        self._limits = limits
        self._peer_issuer = peer_issuer
        self.tokens = tokens
        """What verifies presented tokens (None: ``[identity.tokens]`` is off, any is refused)."""

    async def admit_call(self, inbound: Inbound) -> None:
        """Every check, in order, filling in ``inbound``; raises the first refusal.

        On a refusal ``inbound`` keeps what the checks before it learnt (the
        caller's identity, for the audit record).
        """
        for check in CALL_CHECKS:
            pending = check.run(self, inbound)
            if pending is not None:
                await pending

    async def admit_describe(self, inbound: Inbound) -> None:
        """The Describe prefix (audit, identity, known peer, live grant), like ``admit_call``."""
        for check in DESCRIBE_CHECKS:
            pending = check.run(self, inbound)
            if pending is not None:
                await pending

    # The checks, in the order CALL_CHECKS lists them.

    def audit_available(self, inbound: Inbound) -> None:
        """The audit log can record; otherwise nothing runs."""
        if not self._audit.healthy:
            raise AuditUnavailable("the audit log cannot record; refusing work")

    def identity(self, inbound: Inbound) -> Coroutine[None, None, None] | None:
        """Exactly one SPIFFE ID from the certificate the TLS handshake verified, issued
        within that ID's own trust domain (when bundles of several are trusted).

        A request that presents tokens is identified by
        :meth:`TokenIdentities.identify` (awaited: an unknown ``kid`` may
        fetch its issuer's keys), its certificate optional where the door
        and the config allow; once per request (``PresentedTokens.verified``).
        """
        presented = inbound.call.tokens
        if presented is not None:
            return self._identity_by_tokens(inbound, presented)
        inbound.peer_id = self._certificate_id(inbound.call.peer_cert_pem)
        inbound.query = self._query(inbound)
        return None

    def _certificate_id(self, pem: bytes | None) -> str:
        peer_id = peer_id_from_cert(pem)
        if self._peer_issuer is not None and pem:
            # Before the id is taken as the caller's: a forged one is nobody's.
            self._peer_issuer(pem, peer_id)
        return peer_id

    async def _identity_by_tokens(self, inbound: Inbound, presented: PresentedTokens) -> None:
        pem = inbound.call.peer_cert_pem
        cert_id = self._certificate_id(pem) if pem else ""
        inbound.peer_id = cert_id  # a refusal below is audited under the certificate's id
        if self.tokens is None:
            raise Unauthenticated(
                "this agent accepts no bearer tokens; the caller is identified by its "
                "TLS client certificate only"
            )
        verified = presented.verified
        if verified is None or verified.certificate != pem:
            verified = await self.tokens.identify(cert_id, pem, presented)
            presented.verified = verified
        inbound.peer_id = verified.peer_id
        inbound.user = verified.user
        inbound.query = self._query(inbound)

    def _query(self, inbound: Inbound) -> PolicyQuery:
        query = PolicyQuery(
            self._policies.current,
            self._registry,
            inbound.peer_id,
            inbound.call.capability,
            _ANY_VERSION,
            inbound.call.payload_size,
            datetime.now(UTC),
        )
        query.user = inbound.user
        return query

    def no_claimed_identity(self, inbound: Inbound) -> None:
        """The request claims no identity of its own: only the handshake names the caller."""
        key = inbound.call.claimed_identity
        if key:
            raise Unauthenticated(
                "the caller is identified by its TLS client certificate only; "
                f"remove the metadata {key}"
            )

    def well_formed_request(self, inbound: Inbound) -> None:
        """The envelope parsed, ids and names are plain text, the deadline and constraint parse."""
        call = inbound.call
        if call.malformed:
            raise InvalidRequest("the request is not a valid a2agw.v1.InvokeRequest")
        if call.problem:
            raise InvalidRequest(call.problem)
        if not REQUEST_ID.fullmatch(call.request_id):
            raise InvalidRequest("request_id must be 1-128 characters of [A-Za-z0-9._:-]")
        texts = (
            call.capability,
            call.version_constraint,
            call.task_id,
            call.step_id,
            call.idempotency_key,
        )
        # One scan of them all (a character class cannot match across a join);
        # only a refusal looks for which one it was.
        if has_unsafe_characters("".join(texts)):
            for name, text in zip(_NAMED_TEXTS, texts, strict=True):
                if has_unsafe_characters(text):
                    # Never a legitimate name or id, and shown to operators later:
                    # refused here, and still escaped wherever it is displayed.
                    raise InvalidRequest(f"{name} holds a control or bidi character")
        if call.deadline_unix_ms < 0:
            # Read as "no deadline" it would let a caller opt out of its own deadline.
            raise InvalidRequest("deadline_unix_ms must be 0 (none) or a positive Unix time")
        assert inbound.query is not None
        try:
            inbound.query.constraint = VersionConstraint.parse(call.version_constraint)
        except VersionSyntaxError as err:
            raise InvalidRequest(f"version constraint: {err}") from err

    def within_limits(self, inbound: Inbound) -> None:
        """The peer's rate and in-flight limits and the server's cap; takes a slot.

        A poll of the peer's own tasks needs no room under its ``max_in_flight``:
        its running tasks may hold every place, and it must still see them end.
        A slot the edge took for this request (``inbound.edge_slot``) is adopted,
        not doubled: no second token; if it was taken as a poll and this call
        needs room, the room is checked now.
        """
        assert inbound.query is not None and inbound.query.grant is not None
        grant = inbound.query.grant
        edge = inbound.edge_slot
        if edge is not None and _adoptable(edge, inbound.peer_id):
            if edge.kind is InFlight.POLL and inbound.in_flight is not InFlight.POLL:
                self._limits.make_room(edge.slot, grant)
            edge.adopted = True
            inbound.slot = edge.slot
            return
        if inbound.in_flight is InFlight.POLL and grant.max_in_flight is not None:
            grant = grant.model_copy(update={"max_in_flight": None})
        inbound.slot = self._limits.acquire(inbound.peer_id, grant)

    def parts_accepted(self, inbound: Inbound) -> None:
        """An A2A message's parts are what the chosen version accepts (nothing decoded yet).

        A call that is one JSON object and no message (Invoke, an MCP ``tools/call``,
        a plan step) is one data part: a version that takes no data part refuses it.
        """
        assert inbound.query is not None and inbound.query.chosen is not None
        accepts = inbound.query.chosen.contract.accepts
        message = inbound.call.message
        if message is None:
            if not accepts.data:
                raise ContentTypeNotSupported(
                    "this capability takes no data part, and a call of one JSON object is "
                    f"one; send it an A2A message of the parts it takes ({accepts.describe()})"
                )
            return
        message.check_parts(accepts, _input_model(inbound))

    def payload_decoded(self, inbound: Inbound) -> None:
        """A pending payload becomes JSON for the chosen version, and that JSON is within the cap.

        Runs only for a call every check up to the cap has admitted, so the
        decoding work is bounded by a cap the policy granted.
        """
        pending = inbound.call.pending_payload
        if pending is None:
            return
        model = _input_model(inbound)
        inbound.call = inbound.call.with_decoded_payload(pending.decode(model))
        assert inbound.query is not None
        inbound.query.payload_size = len(inbound.call.payload)
        payload_within_cap(inbound.query)

    async def first_sighting(self, inbound: Inbound) -> None:
        """The request id is new from this peer (replay window, shared by replicas if so set)."""
        if not await self._replay.first_seen(inbound.peer_id, inbound.call.request_id):
            raise ReplayedRequest("this request id was already used by this peer")

    def valid_input(self, inbound: Inbound) -> None:
        """The payload parses into the chosen version's input contract."""
        model = _input_model(inbound)
        try:
            inbound.payload = model.model_validate_json(inbound.call.payload)
        except ValidationError as err:
            raise InvalidInput(_describe_input_error(err, model)) from err

    def conditions_met(self, inbound: Inbound) -> None:
        """The grant's conditions hold for this call, its user and its valid input."""
        assert inbound.query is not None and inbound.query.grant is not None
        if not inbound.query.grant.when:
            return
        assert inbound.payload is not None
        conditions_met(inbound.query, inbound.payload.model_dump(mode="json"))

    def deadline_ahead(self, inbound: Inbound) -> None:
        """The call's deadline has not passed yet."""
        if inbound.call.deadline <= time.monotonic():
            raise DeadlineExceeded("the call's deadline had passed before it could run")


def _input_model(inbound: Inbound) -> type[BaseModel]:
    """What the call's content is validated against: the schema a follow-up answers,
    else the chosen version's input model (no Admission built for it)."""
    message = inbound.call.message
    answers = None if message is None else message.answers
    if answers is not None:
        return answers
    assert inbound.query is not None and inbound.query.chosen is not None
    return inbound.query.chosen.contract.input_model


def _adoptable(edge: EdgeSlot, peer_id: str) -> bool:
    # Once per request, by the caller it was taken for; a slot the edge already
    # gave back (the request ended first) is no place at all.
    return not edge.adopted and not edge.slot.released and edge.slot.peer_id == peer_id


def _policy_step(step: Callable[[PolicyQuery], None]) -> NamedCheck:
    def run(pipeline: DecisionPipeline, inbound: Inbound) -> None:
        assert inbound.query is not None
        step(inbound.query)

    return NamedCheck(step.__name__, run)


CALL_CHECKS: tuple[NamedCheck, ...] = (
    NamedCheck("audit_available", DecisionPipeline.audit_available),
    NamedCheck("identity", DecisionPipeline.identity),
    NamedCheck("no_claimed_identity", DecisionPipeline.no_claimed_identity),
    NamedCheck("well_formed_request", DecisionPipeline.well_formed_request),
    *(_policy_step(step) for step in POLICY_STEPS[:2]),  # known_peer, grant_live
    NamedCheck("within_limits", DecisionPipeline.within_limits),
    *(_policy_step(step) for step in POLICY_STEPS[2:]),
    NamedCheck("parts_accepted", DecisionPipeline.parts_accepted),
    NamedCheck("payload_decoded", DecisionPipeline.payload_decoded),
    NamedCheck("first_sighting", DecisionPipeline.first_sighting),
    NamedCheck("valid_input", DecisionPipeline.valid_input),
    NamedCheck("conditions_met", DecisionPipeline.conditions_met),
    NamedCheck("deadline_ahead", DecisionPipeline.deadline_ahead),
)
"""The whole decision order for a call, identity to deadline."""

DESCRIBE_CHECKS: tuple[NamedCheck, ...] = tuple(
    check
    for check in CALL_CHECKS
    if check.name
    in {"audit_available", "identity", known_peer.__name__, grant_live.__name__, "within_limits"}
)
"""The same checks, filtered (never reordered), for Describe, the agent card and task reads."""


def _describe_input_error(err: ValidationError, model: type[BaseModel]) -> str:
    # Locations and error kinds only: pydantic's messages can echo input values,
    # and an unknown key is payload content, so only declared names are shown.
    declared = _declared_names(model)
    problems = []
    for problem in err.errors(include_url=False, include_input=False)[:5]:
        parts = [
            str(part) if isinstance(part, int) or part in declared else "<unknown field>"
            for part in problem["loc"]
        ]
        problems.append(f"{'.'.join(parts) or '(payload)'}: {problem['type']}")
    more = err.error_count() - len(problems)
    suffix = f" (+{more} more)" if more > 0 else ""
    return "input does not match the contract: " + "; ".join(problems) + suffix


@lru_cache(maxsize=512)
def _declared_names(model: type[BaseModel]) -> frozenset[str]:
    """Every property name the model's JSON Schema declares, at any depth."""
    names: set[str] = set()
    pending: list[object] = [model.model_json_schema()]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict):
                names.update(properties)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return frozenset(names)
