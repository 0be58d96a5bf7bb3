"""The one error tree of the gateway (its gRPC mapping: ``gateway.transport.status``).

Tree (every class carries a stable ``reason`` code, listed in docs/policy.md; the
gRPC status each maps to, from ``STATUS_TABLE`` in the transport, beside it)::

    GatewayError                      INTERNAL
    ├── Unauthenticated               UNAUTHENTICATED    UNAUTHENTICATED
    │   └── TokenInvalid              UNAUTHENTICATED    TOKEN_INVALID         (bearer tokens)
    │       ├── TokenExpired          TOKEN_EXPIRED
    │       ├── TokenAudienceMismatch TOKEN_AUDIENCE_MISMATCH
    │       ├── TokenIssuerUnknown    TOKEN_ISSUER_UNKNOWN
    │       ├── TokenSignatureInvalid TOKEN_SIGNATURE_INVALID
    │       ├── TokenReplayed         TOKEN_REPLAYED
    │       └── TokenNotBound         TOKEN_NOT_BOUND
    ├── PolicyRefusal                 PERMISSION_DENIED
    │   ├── UnknownPeer               UNKNOWN_PEER
    │   ├── GrantExpired              GRANT_EXPIRED
    │   ├── CapabilityNotGranted      CAPABILITY_NOT_GRANTED
    │   ├── RiskNotGranted            RISK_NOT_GRANTED
    │   ├── UserNotAuthorized         USER_NOT_AUTHORIZED
    │   ├── ConditionNotMet           CONDITION_NOT_MET
    │   └── OutboundNotAllowed        OUTBOUND_NOT_ALLOWED
    ├── VersionNotAvailable           NOT_FOUND          VERSION_NOT_AVAILABLE
    ├── PayloadTooLarge               RESOURCE_EXHAUSTED PAYLOAD_TOO_LARGE
    ├── OutputTooLarge                RESOURCE_EXHAUSTED OUTPUT_TOO_LARGE
    ├── LimitRefusal                  RESOURCE_EXHAUSTED (audited aggregated per peer and interval)
    │   ├── RateLimited               RATE_LIMITED
    │   ├── ConcurrencyLimited        CONCURRENCY_LIMITED
    │   └── ServerBusy                SERVER_BUSY
    ├── InvalidInput                  INVALID_ARGUMENT   INVALID_INPUT
    │   └── PushUrlRefused            INVALID_ARGUMENT   PUSH_URL_REFUSED      (A2A push)
    ├── InvalidRequest                INVALID_ARGUMENT   INVALID_REQUEST
    │   └── UnknownMethod             UNIMPLEMENTED      UNKNOWN_METHOD        (gRPC)
    ├── DeadlineExceeded              DEADLINE_EXCEEDED  DEADLINE_EXCEEDED
    │   └── CapabilityTimeout         DEADLINE_EXCEEDED  CAPABILITY_TIMEOUT
    ├── ReplayedRequest               ALREADY_EXISTS     REPLAYED_REQUEST
    ├── IdempotencyConflict           ALREADY_EXISTS     IDEMPOTENCY_CONFLICT
    ├── IdempotencyInDoubt            ABORTED            IDEMPOTENCY_IN_DOUBT
    ├── IdempotencyNotInDoubt         FAILED_PRECONDITION IDEMPOTENCY_NOT_IN_DOUBT (operator CLI)
    ├── InvalidOutput                 INTERNAL           INVALID_OUTPUT
    ├── CapabilityFailed              INTERNAL           CAPABILITY_FAILED
    ├── AuditUnavailable              UNAVAILABLE        AUDIT_UNAVAILABLE
    ├── StateUnavailable              UNAVAILABLE        STATE_UNAVAILABLE
    ├── PeerUnavailable               UNAVAILABLE        PEER_UNAVAILABLE
    │   └── UpstreamUnavailable       UNAVAILABLE        PEER_UNAVAILABLE      (upstreams)
    ├── PeerIdentityMismatch          UNAUTHENTICATED    PEER_IDENTITY_MISMATCH
    ├── Cancelled                     CANCELLED          CANCELLED
    ├── BudgetExhausted               RESOURCE_EXHAUSTED BUDGET_EXHAUSTED      (plans)
    ├── NoRoute                       FAILED_PRECONDITION NO_ROUTE             (plans)
    ├── ExpectationFailed             FAILED_PRECONDITION EXPECTATION_FAILED   (plans)
    ├── TaskLeased                    ABORTED            TASK_LEASED           (plans)
    ├── ApprovalDenied                PERMISSION_DENIED  APPROVAL_DENIED       (plans)
    ├── Stagnated                     ABORTED            STAGNATED             (plans)
    ├── Unverified                    FAILED_PRECONDITION UNVERIFIED           (plans)
    ├── UnsupportedOperation          UNIMPLEMENTED      UNSUPPORTED_OPERATION (A2A)
    ├── PushNotificationNotSupported  UNIMPLEMENTED      PUSH_NOTIFICATION_NOT_SUPPORTED (A2A)
    │   └── PushNotGranted            UNIMPLEMENTED      PUSH_NOT_GRANTED      (A2A push)
    ├── PushConfigLimit               RESOURCE_EXHAUSTED PUSH_CONFIG_LIMIT     (A2A push)
    ├── ProtocolVersionNotSupported   UNIMPLEMENTED      VERSION_NOT_SUPPORTED (A2A)
    ├── ContentTypeNotSupported       INVALID_ARGUMENT   CONTENT_TYPE_NOT_SUPPORTED (A2A)
    ├── TaskNotCancelable             FAILED_PRECONDITION TASK_NOT_CANCELABLE  (A2A)
    ├── TaskInterrupted               ABORTED            TASK_INTERRUPTED      (A2A tasks)
    ├── AgentStopping                 UNAVAILABLE        AGENT_STOPPING        (A2A tasks)
    ├── TaskNotFound                  NOT_FOUND          TASK_NOT_FOUND        (plans, A2A)
    └── ConfigError                   FAILED_PRECONDITION
        ├── PolicyFileError           POLICY_INVALID
        ├── AgentConfigError          CONFIG_INVALID
        │   └── AddressUnavailable    ADDRESS_UNAVAILABLE   (a listen address is taken)
        └── PlanInvalid               PLAN_INVALID                             (plans)

What an error means for retries and plans is a fact of its class, asked in one
place (``GatewayError.transient``, ``nothing_ran``, ``peer_specific``,
``spends_request_id``, ``version_specific``, ``unanswered``), never a table
kept beside the tree. Which reasons a peer
may answer with is one too (``peer_may_answer``): the others (this side's own TLS
check of the peer, its plans, files and cancellations) are never taken from a peer.

Lower-level exceptions are translated into this tree only at boundaries (the
gRPC servicer, the peer client, the CLI), always with ``raise ... from err``.
"""

from __future__ import annotations

from typing import ClassVar

ERROR_DOMAIN = "a2agw.v1"


class GatewayError(Exception):
    """Root of every error the gateway raises on purpose.

    Attributes:
        reason: Stable, machine-readable reason code (crosses the wire).
        message: Human-readable explanation; never contains payload content.
        detail: The true reason, kept in the audit record, never sent.
    """

    reason: ClassVar[str] = "INTERNAL"

    transient: ClassVar[bool] = False
    """Worth trying again: the same peer may answer next time (plans retry safe steps)."""

    nothing_ran: ClassVar[bool] = False
    """Proves the capability did not run (refused before it started), so a write that
    got this answer may still go elsewhere; anything else may follow a run."""

    peer_specific: ClassVar[bool] = False
    """Another peer might answer differently, so a plan may reroute the step."""

    spends_request_id: ClassVar[bool] = False
    """Given after the replay check: the call's request id counts as used."""

    version_specific: ClassVar[bool] = False
    """Another version of the capability might be served, so a plan may relax the
    step's version constraint to a compatible one and try again."""

    unanswered: ClassVar[bool] = False
    """No answer came (not reached, wrong identity, out of time, cancelled): the call
    failed rather than being refused, and the CLI says so."""

    peer_may_answer: ClassVar[bool] = False
    """A peer's gateway answers calls with this reason, so the client believes a peer's
    ``ErrorInfo`` naming it (``gateway.transport.status.from_rpc_error``). False for
    what only this side can know (its own TLS check of the peer's identity, its plans,
    budgets, files, cancellations): a peer that received a call and claims one of
    those is not believed, so it cannot make the call look as if nothing ran."""

    def __init__(self, message: str = "", *, detail: str = "") -> None:
        super().__init__(message or self.reason)
        self.message = message or self.reason
        # For the audit record only; never sent to the caller (it may reveal
        # whether an ungranted capability exists).
        self.detail = detail

    REMOTE_MESSAGE: ClassVar[str | None] = None
    """A fixed message sent to remote callers instead of ``message`` (None: send it)."""

    @property
    def remote_message(self) -> str:
        """What a remote caller is told: the fixed message of the class, if it has one."""
        return self.REMOTE_MESSAGE if self.REMOTE_MESSAGE is not None else self.message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class Unauthenticated(GatewayError):
    """The caller presented no certificate yielding exactly one SPIFFE ID."""

    reason = "UNAUTHENTICATED"
    peer_may_answer = True
    nothing_ran = True


class TokenInvalid(Unauthenticated):
    """A bearer token (the caller's or its user's) that this agent does not accept.

    The base of every token refusal, and the reason itself for what has no
    finer one: a malformed or oversized token, an ``alg`` this issuer is not
    configured for (``none``, ``HS256``), a missing or unknown ``kid``, a
    missing claim, a lifetime above the configured maximum, a token on a
    door or in a config that takes none. The token itself is never in a
    message, a detail or a log line.
    """

    reason = "TOKEN_INVALID"


class TokenExpired(TokenInvalid):
    """The token's ``exp`` has passed (beyond the configured clock skew)."""

    reason = "TOKEN_EXPIRED"


class TokenAudienceMismatch(TokenInvalid):
    """The token's ``aud`` does not name this agent's configured audience."""

    reason = "TOKEN_AUDIENCE_MISMATCH"


class TokenIssuerUnknown(TokenInvalid):
    """No trusted issuer (``[[identity.tokens.issuers]]``) matches the token."""

    reason = "TOKEN_ISSUER_UNKNOWN"


class TokenSignatureInvalid(TokenInvalid):
    """The token's signature does not verify with the issuer's key its ``kid`` names."""

    reason = "TOKEN_SIGNATURE_INVALID"


class TokenReplayed(TokenInvalid):
    """A single-use token (its issuer's ``single_use_jti``) presented a second time."""

    reason = "TOKEN_REPLAYED"


class TokenNotBound(TokenInvalid):
    """The token was not issued to the party presenting it.

    A caller token naming another identity than the client certificate (or
    whose ``cnf.x5t#S256`` is not that certificate's), a certificate-bound
    token without its certificate, or a user token whose actor (``act.sub``,
    else ``azp``) is not the caller.
    """

    reason = "TOKEN_NOT_BOUND"


class PolicyRefusal(GatewayError):
    """The caller is known (or not) but the policy does not allow the call."""

    reason = "POLICY_REFUSED"
    peer_may_answer = True
    nothing_ran = True
    peer_specific = True


class UnknownPeer(PolicyRefusal):
    """No grant exists for the caller's SPIFFE ID."""

    reason = "UNKNOWN_PEER"


class GrantExpired(PolicyRefusal):
    """The caller's grant has passed its ``expires_at``."""

    reason = "GRANT_EXPIRED"


class CapabilityNotGranted(PolicyRefusal):
    """The grant does not name this capability (or it does not exist)."""

    reason = "CAPABILITY_NOT_GRANTED"


class RiskNotGranted(PolicyRefusal):
    """The capability's risk is above the grant's ``max_risk``."""

    reason = "RISK_NOT_GRANTED"


class UserNotAuthorized(PolicyRefusal):
    """The grant needs a user the call does not carry (``users = "required"``), or the
    user's claims do not match its ``user_claims``; or a call for a user cannot get a
    token for that user to carry on (outbound: nothing was sent)."""

    reason = "USER_NOT_AUTHORIZED"


class ConditionNotMet(PolicyRefusal):
    """A condition of the grant (``when``) is not true for this call; its message names
    the condition, never the values it read."""

    reason = "CONDITION_NOT_MET"
    spends_request_id = True  # decided after the replay check (it reads the valid input)


class OutboundNotAllowed(PolicyRefusal):
    """This agent's outbound rules forbid sending the capability to that peer."""

    reason = "OUTBOUND_NOT_ALLOWED"
    peer_may_answer = False  # this agent's own outbound rules refused


class VersionNotAvailable(GatewayError):
    """No version the caller may call satisfies the requested constraint."""

    reason = "VERSION_NOT_AVAILABLE"
    peer_may_answer = True
    nothing_ran = True
    peer_specific = True
    version_specific = True


class PayloadTooLarge(GatewayError):
    """The raw payload is larger than the caller's cap."""

    reason = "PAYLOAD_TOO_LARGE"
    peer_may_answer = True
    nothing_ran = True
    peer_specific = True


class OutputTooLarge(GatewayError):
    """The capability's output is larger than the caller's cap."""

    reason = "OUTPUT_TOO_LARGE"
    peer_may_answer = True
    peer_specific = True


class OutputChunksTooLarge(OutputTooLarge):
    """The chunks a capability streamed exceed the caller's cap (its own output, not an
    answer it was given)."""


class LimitRefusal(GatewayError):
    """A call refused by a rate or concurrency limit, before any parsing.

    Such refusals can come in floods, so the audit log keeps them aggregated:
    the first of a peer's interval is one durable record, the rest one record
    per peer, reason and interval with ``count=N`` in its detail (see
    ``gateway.inbound.limits.refusal_log``).
    """

    reason = "LIMIT_REFUSED"
    peer_may_answer = True
    nothing_ran = True


class RateLimited(LimitRefusal):
    """The peer called faster than its grant's ``max_calls_per_second`` (and ``burst``)."""

    reason = "RATE_LIMITED"


class ConcurrencyLimited(LimitRefusal):
    """The peer already has its grant's ``max_in_flight`` calls running here."""

    reason = "CONCURRENCY_LIMITED"


class ServerBusy(LimitRefusal):
    """The agent already runs ``max_concurrent_calls`` calls (all peers together)."""

    reason = "SERVER_BUSY"


class InvalidInput(GatewayError):
    """The payload is not valid JSON or does not match the input schema."""

    reason = "INVALID_INPUT"
    peer_may_answer = True
    nothing_ran = True
    spends_request_id = True


class InvalidRequest(GatewayError):
    """The request envelope itself is malformed (ids, constraint syntax)."""

    reason = "INVALID_REQUEST"
    peer_may_answer = True
    nothing_ran = True


class UnknownMethod(InvalidRequest):
    """A gRPC method this agent does not serve; gRPC clients expect ``UNIMPLEMENTED``.

    (The HTTPS port refuses an unknown path or JSON-RPC method as its parent,
    ``INVALID_REQUEST``, with the binding's own status.)
    """

    reason = "UNKNOWN_METHOD"


class DeadlineExceeded(GatewayError):
    """The call's deadline has passed (or had passed on arrival)."""

    reason = "DEADLINE_EXCEEDED"
    peer_may_answer = True
    transient = True
    spends_request_id = True
    unanswered = True


class CapabilityTimeout(DeadlineExceeded):
    """The capability ran past its contract timeout and was cancelled."""

    reason = "CAPABILITY_TIMEOUT"


class ReplayedRequest(GatewayError):
    """A request id this agent has already seen from this peer."""

    reason = "REPLAYED_REQUEST"
    peer_may_answer = True
    nothing_ran = True


class IdempotencyConflict(GatewayError):
    """An idempotency key reused with a different payload."""

    reason = "IDEMPOTENCY_CONFLICT"
    peer_may_answer = True
    nothing_ran = True


class IdempotencyInDoubt(GatewayError):
    """An earlier attempt with this key was cut off mid-run; running again could write twice."""

    reason = "IDEMPOTENCY_IN_DOUBT"
    peer_may_answer = True


class IdempotencyNotInDoubt(GatewayError):
    """An operator tried to resolve or release a key that is not in doubt.

    The key is unknown, already done, or still claimed by a running attempt:
    changing it could lose a stored answer or let a write run twice.
    """

    reason = "IDEMPOTENCY_NOT_IN_DOUBT"


class InvalidOutput(GatewayError):
    """The capability returned output that violates its contract."""

    reason = "INVALID_OUTPUT"
    peer_may_answer = True
    peer_specific = True


class CapabilityFailed(GatewayError):
    """The capability raised; details stay in the server log, not on the wire."""

    reason = "CAPABILITY_FAILED"
    peer_may_answer = True
    peer_specific = True


class AuditUnavailable(GatewayError):
    """The audit log cannot record, so the agent refuses work (fails closed).

    The message names the store and the cause (a path, a redacted DSN, the
    database's error) for the agent's own log and CLI; remote callers get
    only ``REMOTE_MESSAGE``.
    """

    reason = "AUDIT_UNAVAILABLE"
    peer_may_answer = True
    transient = True
    REMOTE_MESSAGE = "the agent's audit log cannot record, so nothing runs; retry later"


class StateUnavailable(GatewayError):
    """Durable state (idempotency records) cannot be read or written; nothing ran.

    As for AuditUnavailable, remote callers get only ``REMOTE_MESSAGE``.
    """

    reason = "STATE_UNAVAILABLE"
    peer_may_answer = True
    transient = True
    REMOTE_MESSAGE = "the agent's state store is unavailable, so nothing ran; retry later"


class PeerUnavailable(GatewayError):
    """The peer could not be reached, or answered ``UNAVAILABLE`` (the call may have run)."""

    reason = "PEER_UNAVAILABLE"
    peer_may_answer = True
    transient = True
    unanswered = True


class UpstreamUnavailable(PeerUnavailable):
    """An A2A agent or MCP server this agent fronts (``[[upstreams]]``,
    ``[[mcp_upstreams]]``) could not be reached.

    The one gateway error a capability may raise and have passed on as its
    answer (see ``capabilities.runner``): only the capability built for that
    upstream, naming it. It crosses the wire as PEER_UNAVAILABLE: callers see
    that the agent behind could not be reached, not which one or why (the audit
    detail says, e.g. PEER_IDENTITY_MISMATCH).

    Attributes:
        upstream: The upstream's name (its SPIFFE ID, else its address or URL;
            ``mcp:NAME`` for an MCP server).
    """

    def __init__(self, message: str = "", *, upstream: str = "", detail: str = "") -> None:
        super().__init__(message, detail=detail)
        self.upstream = upstream


class PeerIdentityMismatch(GatewayError):
    """The server's certificate does not carry the expected peer's SPIFFE ID."""

    reason = "PEER_IDENTITY_MISMATCH"
    nothing_ran = True
    unanswered = True


class Cancelled(GatewayError):
    """The call was cancelled by the caller."""

    reason = "CANCELLED"
    unanswered = True


class ConfigError(GatewayError):
    """A local configuration problem (file, key, why)."""

    reason = "CONFIG_INVALID"


class PolicyFileError(ConfigError):
    """A policy file is unreadable or invalid."""

    reason = "POLICY_INVALID"


class AgentConfigError(ConfigError):
    """An agent config file is unreadable or invalid."""

    reason = "CONFIG_INVALID"


class AddressUnavailable(AgentConfigError):
    """A configured listen address cannot be bound (gRPC, A2A over HTTPS, workers):
    another process listens there, or the address is not on this host."""

    reason = "ADDRESS_UNAVAILABLE"


class PlanInvalid(ConfigError):
    """A plan failed validation or a static check; the message names the step."""

    reason = "PLAN_INVALID"


class TaskNotFound(GatewayError):
    """No stored task has that id (or, over A2A, none of the caller's tasks has it).

    A missing task is not a configuration error: it answers one request, and
    an operator who names one gets a usage error from the CLI boundary.
    """

    reason = "TASK_NOT_FOUND"
    peer_may_answer = True


class BudgetExhausted(GatewayError):
    """A task ran out of steps, peer calls or time before it finished."""

    reason = "BUDGET_EXHAUSTED"
    nothing_ran = True


class NoRoute(GatewayError):
    """No local capability and no authorized peer can run a step."""

    reason = "NO_ROUTE"
    nothing_ran = True
    version_specific = True


class ExpectationFailed(GatewayError):
    """A step's output does not satisfy the step's ``expect`` condition."""

    reason = "EXPECTATION_FAILED"
    peer_specific = True


class ApprovalDenied(GatewayError):
    """A person denied a plan step that needed approval; it sent nothing."""

    reason = "APPROVAL_DENIED"
    nothing_ran = True


class Stagnated(GatewayError):
    """A replan would repeat a step on the same peer with the same input as an attempt
    that already failed, so the task stops instead of spending its budget on it."""

    reason = "STAGNATED"


class Unverified(GatewayError):
    """A step depends on a result whose sources disagree (``on_unverified: stop``)."""

    reason = "UNVERIFIED"


class TaskLeased(GatewayError):
    """Another live process holds the task's lease (it is running the task), or this
    process lost the lease; nothing more of the task runs here."""

    reason = "TASK_LEASED"


class UnsupportedOperation(GatewayError):
    """An A2A operation this gateway does not offer (streaming, subscriptions)."""

    reason = "UNSUPPORTED_OPERATION"
    peer_may_answer = True


class PushNotificationNotSupported(GatewayError):
    """A2A push-notification configuration: this agent sends no push notifications
    (``[push] enabled`` is off)."""

    reason = "PUSH_NOTIFICATION_NOT_SUPPORTED"
    peer_may_answer = True


class PushNotGranted(PushNotificationNotSupported):
    """The caller's grant names no webhook host (``push_hosts``): no push for it here.

    A2A clients see the spec's PushNotificationNotSupportedError.
    """

    reason = "PUSH_NOT_GRANTED"


class PushUrlRefused(InvalidInput):
    """A webhook URL this agent will not call for this caller: not ``https``, malformed,
    a host its grant's ``push_hosts`` does not name, or an address it may not reach.

    A2A clients see the spec's INVALID_PARAMS (as the a2a-sdk answers an unsafe URL).
    """

    reason = "PUSH_URL_REFUSED"
    spends_request_id = False


class PushConfigLimit(GatewayError):
    """The task already has as many push configs as ``[push] max_configs_per_task``."""

    reason = "PUSH_CONFIG_LIMIT"
    peer_may_answer = True
    nothing_ran = True


class ProtocolVersionNotSupported(GatewayError):
    """The caller speaks an A2A protocol version other than 1.x (``a2a-version``)."""

    reason = "VERSION_NOT_SUPPORTED"
    peer_may_answer = True


class ContentTypeNotSupported(GatewayError):
    """A media type this agent does not take (A2A's ContentTypeNotSupportedError).

    Said of a request body on the HTTPS port that is not declared JSON (a form
    or ``text/plain`` post a browser may send cross-site is never run), before
    the body is read; and of a message part of a kind or media type the chosen
    capability version does not accept, before any part is decoded.
    """

    reason = "CONTENT_TYPE_NOT_SUPPORTED"
    peer_may_answer = True
    nothing_ran = True


class TaskNotCancelable(GatewayError):
    """The A2A task has already finished, so it cannot be cancelled."""

    reason = "TASK_NOT_CANCELABLE"
    peer_may_answer = True


class TaskInterrupted(GatewayError):
    """An A2A task was running when its agent stopped or died; it was not resumed.

    Only ever a failed task's reason (``GetTask``, a stream's last event), never
    a refusal: the capability may have run partly, so a write may have happened.
    """

    reason = "TASK_INTERRUPTED"
    peer_may_answer = True  # what a serving agent says of its own task


class AgentStopping(GatewayError):
    """This agent process is stopping: it takes no new task, and cuts what it cannot end.

    Said of a message that would start a background task (nothing ran: send it
    again, to another worker or replica or later, with a new ``message_id``),
    and of a subscription following a task another process runs: the task goes
    on there; subscribe again, or poll.
    """

    reason = "AGENT_STOPPING"
    nothing_ran = True  # no task was started, and a subscription runs nothing
    peer_may_answer = True  # what a serving agent says of itself


def all_error_classes() -> list[type[GatewayError]]:
    """Every GatewayError subclass (transitively), root included."""
    found: list[type[GatewayError]] = [GatewayError]
    index = 0
    while index < len(found):
        found.extend(found[index].__subclasses__())
        index += 1
    return found


def reasons_where(fact: str) -> frozenset[str]:
    """The reason codes of every class for which the boolean ``fact`` holds."""
    return frozenset(cls.reason for cls in all_error_classes() if getattr(cls, fact))


def error_for_reason(reason: str) -> type[GatewayError]:
    """The error class whose reason code is ``reason`` (GatewayError if none)."""
    return _BY_REASON.get(reason, GatewayError)


def _index_by_reason() -> dict[str, type[GatewayError]]:
    table: dict[str, type[GatewayError]] = {}
    for cls in all_error_classes():
        # AgentConfigError shares CONFIG_INVALID with ConfigError, and
        # UpstreamUnavailable PEER_UNAVAILABLE with PeerUnavailable: keep the base.
        table.setdefault(cls.reason, cls)
    return table


_BY_REASON = _index_by_reason()
