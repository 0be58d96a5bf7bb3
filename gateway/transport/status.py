"""Errors across the wire: GatewayError ⇄ google.rpc.Status with ErrorInfo.

The one table mapping the error tree to gRPC status codes lives here, in the
transport, so ``policies/`` and ``capabilities/`` never import gRPC.

The server turns a GatewayError into a status (code from ``STATUS_TABLE``,
``ErrorInfo(reason, domain)``); the client turns it back into the same class,
but only for what a peer may say: a reason whose class is ``peer_may_answer``,
with the status code the table gives it. Anything else a peer answers (a
reason only this side decides, such as ``PEER_IDENTITY_MISMATCH``, ``CANCELLED``
or ``BUDGET_EXHAUSTED``, a code that does not go with the reason, any status
text) is mapped by its status code alone, to a class that never claims that
nothing ran: the call reached the peer and may have run there. Whether the
server is the identity asked for is decided before sending, by the handshake
(``gateway.client.handshake``), never from an answer.
"""

from __future__ import annotations

from functools import lru_cache

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.errors import (
    ERROR_DOMAIN,
    AgentStopping,
    ApprovalDenied,
    AuditUnavailable,
    BudgetExhausted,
    Cancelled,
    CapabilityFailed,
    ConfigError,
    ContentTypeNotSupported,
    DeadlineExceeded,
    ExpectationFailed,
    GatewayError,
    IdempotencyConflict,
    IdempotencyInDoubt,
    IdempotencyNotInDoubt,
    InvalidInput,
    InvalidOutput,
    InvalidRequest,
    LimitRefusal,
    NoRoute,
    OutputTooLarge,
    PayloadTooLarge,
    PeerIdentityMismatch,
    PeerUnavailable,
    PolicyRefusal,
    ProtocolVersionNotSupported,
    PushConfigLimit,
    PushNotificationNotSupported,
    ReplayedRequest,
    Stagnated,
    StateUnavailable,
    TaskInterrupted,
    TaskLeased,
    TaskNotCancelable,
    TaskNotFound,
    Unauthenticated,
    UnknownMethod,
    UnsupportedOperation,
    Unverified,
    VersionNotAvailable,
    error_for_reason,
)

STATUS_TABLE: dict[type[GatewayError], grpc.StatusCode] = {
    GatewayError: grpc.StatusCode.INTERNAL,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PolicyRefusal: grpc.StatusCode.PERMISSION_DENIED,
    VersionNotAvailable: grpc.StatusCode.NOT_FOUND,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    OutputTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    LimitRefusal: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownMethod: grpc.StatusCode.UNIMPLEMENTED,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    ReplayedRequest: grpc.StatusCode.ALREADY_EXISTS,
    IdempotencyConflict: grpc.StatusCode.ALREADY_EXISTS,
    IdempotencyInDoubt: grpc.StatusCode.ABORTED,
    IdempotencyNotInDoubt: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidOutput: grpc.StatusCode.INTERNAL,
    CapabilityFailed: grpc.StatusCode.INTERNAL,
    AuditUnavailable: grpc.StatusCode.UNAVAILABLE,
    StateUnavailable: grpc.StatusCode.UNAVAILABLE,
    PeerUnavailable: grpc.StatusCode.UNAVAILABLE,
    PeerIdentityMismatch: grpc.StatusCode.UNAUTHENTICATED,
    Cancelled: grpc.StatusCode.CANCELLED,
    ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
    TaskNotFound: grpc.StatusCode.NOT_FOUND,
    BudgetExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NoRoute: grpc.StatusCode.FAILED_PRECONDITION,
    ExpectationFailed: grpc.StatusCode.FAILED_PRECONDITION,
    TaskLeased: grpc.StatusCode.ABORTED,
    ApprovalDenied: grpc.StatusCode.PERMISSION_DENIED,
    Stagnated: grpc.StatusCode.ABORTED,
    Unverified: grpc.StatusCode.FAILED_PRECONDITION,
    # A2A 1.0 spec section 5.4 codes (the 1.0.0 table: see gateway.server.a2a.wire_errors).
    UnsupportedOperation: grpc.StatusCode.UNIMPLEMENTED,
    PushNotificationNotSupported: grpc.StatusCode.UNIMPLEMENTED,
    PushConfigLimit: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ProtocolVersionNotSupported: grpc.StatusCode.UNIMPLEMENTED,
    ContentTypeNotSupported: grpc.StatusCode.INVALID_ARGUMENT,
    TaskNotCancelable: grpc.StatusCode.FAILED_PRECONDITION,
    TaskInterrupted: grpc.StatusCode.ABORTED,
    AgentStopping: grpc.StatusCode.UNAVAILABLE,
}
"""Error class → gRPC status. Subclasses inherit their nearest listed ancestor."""


def status_code_for(error: GatewayError) -> grpc.StatusCode:
    """The gRPC status code for ``error``, by nearest ancestor in STATUS_TABLE."""
    return _code_for_class(type(error))


def _code_for_class(error_class: type[GatewayError]) -> grpc.StatusCode:
    for cls in error_class.__mro__:
        code = STATUS_TABLE.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def to_grpc_status(error: GatewayError) -> grpc.Status:
    """The rich status the server aborts with for ``error``."""
    return _status_for(status_code_for(error).value[0], error.reason, error.remote_message)


@lru_cache(maxsize=256)
def _status_for(code: int, reason: str, message: str) -> grpc.Status:
    # Built once per distinct refusal: a refusal costs no more than an allowed
    # call, and building the protobuf status was ~5 us of it. The result is
    # immutable (code, details, a tuple of trailing metadata); messages carry
    # sizes and names, never payload content, and the cache is bounded.
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN)
    detail = status_pb2.Status(code=code, message=message)
    detail.details.add().Pack(info)
    return rpc_status.to_status(detail)


_BY_CODE: dict[grpc.StatusCode, type[GatewayError]] = {
    grpc.StatusCode.UNAVAILABLE: PeerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}
"""A failed call with no believable ErrorInfo, by status code; the root for other codes.

None of these claims that nothing ran: the call was sent (``PeerClient`` sends
only once the handshake succeeded), so the peer may have run it, whatever it
says. A bare ``UNAUTHENTICATED`` or ``CANCELLED`` is the root too: a gateway
refusing a caller says so with its ErrorInfo, and a cancellation of ours is
never a peer's answer."""


def from_rpc_error(err: grpc.RpcError) -> GatewayError:
    """Map a failed call back to the GatewayError subclass it stands for.

    A peer's ``ErrorInfo`` is believed only for a reason a peer may give
    (``peer_may_answer``) with the code ``STATUS_TABLE`` gives it; otherwise the
    status code alone decides (``_BY_CODE``), and the message says the claim was
    not believed.
    """
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else "") or ""
    status = _rich_status(err)
    claimed = None if status is None else _claimed_reason(status)
    if status is not None and claimed is not None:
        error_class = error_for_reason(claimed)
        if _believable(error_class, code):
            return error_class(status.message)
    message = f"{code.name}: {details}" if details else code.name
    if claimed is not None:
        message += f" (the peer's reason {claimed[:64]!r} is not believed)"
    return _BY_CODE.get(code, GatewayError)(message)


def _claimed_reason(status: status_pb2.Status) -> str | None:
    """The reason of the first ErrorInfo of our domain in ``status``, if any."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return str(info.reason)
    return None


def _believable(error_class: type[GatewayError], code: grpc.StatusCode) -> bool:
    # The root (also what an unknown reason maps to) claims nothing, so taking
    # it at its word costs nothing.
    answerable = error_class is GatewayError or error_class.peer_may_answer
    return answerable and _code_for_class(error_class) == code


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    try:
        return rpc_status.from_call(err)
    except (ValueError, AttributeError):
        return None
