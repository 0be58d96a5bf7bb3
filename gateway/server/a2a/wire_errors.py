"""GatewayError → the gRPC status an A2A client understands.

The status carries our own ``ErrorInfo(reason, domain="a2agw.v1")`` (so
``gateway.transport.status.from_rpc_error`` maps it back to the same class) and,
for errors the A2A specification defines, a second ``ErrorInfo`` with the
spec's domain and reason, from which a2a-sdk clients raise the matching
``a2a.utils.errors`` class. The SDK client takes the *last* ErrorInfo of the
spec's domain and ignores the others, so the order does not matter to it; ours
comes first, as ``from_rpc_error`` takes the first of its domain.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.errors import (
    ERROR_DOMAIN,
    ContentTypeNotSupported,
    GatewayError,
    InvalidInput,
    InvalidRequest,
    ProtocolVersionNotSupported,
    PushNotificationNotSupported,
    TaskNotCancelable,
    TaskNotFound,
    UnsupportedOperation,
)
from gateway.transport.status import status_code_for

SPEC_DOMAIN = "a2a-protocol.org"
"""``ErrorInfo.domain`` of the errors the A2A specification defines."""

SPEC_REASONS: dict[type[GatewayError], str] = {
    TaskNotFound: "TASK_NOT_FOUND",
    TaskNotCancelable: "TASK_NOT_CANCELABLE",
    PushNotificationNotSupported: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    UnsupportedOperation: "UNSUPPORTED_OPERATION",
    ContentTypeNotSupported: "CONTENT_TYPE_NOT_SUPPORTED",
    ProtocolVersionNotSupported: "VERSION_NOT_SUPPORTED",
    InvalidRequest: "INVALID_REQUEST",
    InvalidInput: "INVALID_PARAMS",
}
"""Our error → the spec's reason. Each pair has the same gRPC code in both tables;
a subclass inherits its nearest listed ancestor's entry."""


def spec_reason_for(error: GatewayError) -> str | None:
    """The A2A spec's reason for ``error``, by nearest ancestor; None if it has none."""
    for cls in type(error).__mro__:
        reason = SPEC_REASONS.get(cls)
        if reason is not None:
            return reason
    return None


def to_a2a_status(error: GatewayError) -> grpc.Status:
    """The rich status an A2A method aborts with for ``error``."""
    code = status_code_for(error)
    detail = status_pb2.Status(code=code.value[0], message=error.remote_message)
    detail.details.add().Pack(error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN))
    spec_reason = spec_reason_for(error)
    if spec_reason is not None:
        detail.details.add().Pack(
            error_details_pb2.ErrorInfo(reason=spec_reason, domain=SPEC_DOMAIN)
        )
    return rpc_status.to_status(detail)
