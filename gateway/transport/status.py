"""Errors across the wire: GatewayError ⇄ google.rpc.Status with ErrorInfo.

The one table mapping the error tree to gRPC status codes lives here, in the
transport, so ``policies/`` and ``capabilities/`` never import gRPC.

The server turns a GatewayError into a status (code from ``STATUS_TABLE``,
``ErrorInfo(reason, domain)``); the client turns it back into the same class.
"""

from __future__ import annotations

from functools import lru_cache

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.errors import (
    ERROR_DOMAIN,
    ApprovalDenied,
    AuditUnavailable,
    BudgetExhausted,
    Cancelled,
    CapabilityFailed,
    ConfigError,
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
    PushNotificationNotSupported,
    ReplayedRequest,
    Stagnated,
    StateUnavailable,
    TaskLeased,
    TaskNotCancelable,
    TaskNotFound,
    Unauthenticated,
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
    # A2A 1.0 spec section 5.4 codes.
    UnsupportedOperation: grpc.StatusCode.FAILED_PRECONDITION,
    PushNotificationNotSupported: grpc.StatusCode.FAILED_PRECONDITION,
    ProtocolVersionNotSupported: grpc.StatusCode.FAILED_PRECONDITION,
    TaskNotCancelable: grpc.StatusCode.FAILED_PRECONDITION,
}
"""Error class → gRPC status. Subclasses inherit their nearest listed ancestor."""


def status_code_for(error: GatewayError) -> grpc.StatusCode:
    """The gRPC status code for ``error``, by nearest ancestor in STATUS_TABLE."""
    for cls in type(error).__mro__:
        code = STATUS_TABLE.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def to_grpc_status(error: GatewayError) -> grpc.Status:
    """The rich status the server aborts with for ``error``."""
    return _status_for(status_code_for(error).value[0], error.reason, error.message)


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


# Transport-level failures that carry no ErrorInfo (the request never reached
# the gateway code, or the channel broke).
_TRANSPORT_ERRORS: dict[grpc.StatusCode, type[GatewayError]] = {
    grpc.StatusCode.UNAVAILABLE: PeerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

_NAME_MISMATCH_HINTS = ("Hostname Verification Check failed", "not in peer certificate")


def from_rpc_error(err: grpc.RpcError) -> GatewayError:
    """Map a failed call back to the GatewayError subclass it stands for."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else "") or ""
    status = _rich_status(err)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN:
                    return error_for_reason(info.reason)(status.message)
    if code == grpc.StatusCode.UNAVAILABLE and any(h in details for h in _NAME_MISMATCH_HINTS):
        return PeerIdentityMismatch(
            "the server's certificate does not carry the expected peer's SPIFFE ID"
        )
    error_class = _TRANSPORT_ERRORS.get(code, GatewayError)
    return error_class(f"{code.name}: {details}" if details else code.name)


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    try:
        return rpc_status.from_call(err)
    except (ValueError, AttributeError):
        return None
