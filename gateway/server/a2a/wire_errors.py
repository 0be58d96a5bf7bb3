"""GatewayError → the gRPC status an A2A client understands, and the spec's error table.

For an error the A2A specification defines, the status carries the spec's
``ErrorInfo(reason, domain="a2a-protocol.org")`` first (spec 10.6; clients that
read one ErrorInfo read the first: the TCK, ``@a2a-js/sdk``), then our own
``ErrorInfo(reason, domain="a2agw.v1")``, from which
``gateway.transport.status.from_rpc_error`` maps it back to the same class (it
takes the first of its domain, wherever it is). Any other error carries ours only.

:data:`SPEC_ERRORS` is the spec's table (section 5.4), one row per reason: the
JSON-RPC code, gRPC status and HTTP status of each error it defines. It is the
table of the A2A 1.0.0 release (``UNIMPLEMENTED`` for UNSUPPORTED_OPERATION,
PUSH_NOTIFICATION_NOT_SUPPORTED and VERSION_NOT_SUPPORTED; HTTP 409 for
TASK_NOT_CANCELABLE, 415 for CONTENT_TYPE_NOT_SUPPORTED), which the official
TCK checks. The 1.0.1 text changed those rows to ``FAILED_PRECONDITION`` and
``400`` (A2A #1627), as a2a-sdk 1.3 and ``@a2a-js/sdk`` 1.3 answer. Clients of
either SDK map an error by its ErrorInfo reason, never by the code, so both
tables reach them as the same error. The gRPC column is also
``gateway.transport.status.STATUS_TABLE``'s code for the class (a test holds
the two together).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.errors import ERROR_DOMAIN, GatewayError
from gateway.transport.status import status_code_for

SPEC_DOMAIN = "a2a-protocol.org"
"""``ErrorInfo.domain`` of the errors the A2A specification defines."""


@dataclass(frozen=True)
class SpecError:
    """How the A2A spec answers one of its errors on each binding (a row of its table 5.4).

    Attributes:
        reason: The spec's ``ErrorInfo`` reason (its error name, UPPER_SNAKE_CASE).
        jsonrpc: JSON-RPC ``error.code``.
        grpc: gRPC status code.
        http: HTTP status on the HTTP+JSON binding.
    """

    reason: str
    jsonrpc: int
    grpc: grpc.StatusCode
    http: int


_CODE = grpc.StatusCode
SPEC_ERRORS: dict[str, SpecError] = {
    "TASK_NOT_FOUND": SpecError("TASK_NOT_FOUND", -32001, _CODE.NOT_FOUND, 404),
    "TASK_NOT_CANCELABLE": SpecError("TASK_NOT_CANCELABLE", -32002, _CODE.FAILED_PRECONDITION, 409),
    "PUSH_NOTIFICATION_NOT_SUPPORTED": SpecError(
        "PUSH_NOTIFICATION_NOT_SUPPORTED", -32003, _CODE.UNIMPLEMENTED, 400
    ),
    "UNSUPPORTED_OPERATION": SpecError("UNSUPPORTED_OPERATION", -32004, _CODE.UNIMPLEMENTED, 400),
    "CONTENT_TYPE_NOT_SUPPORTED": SpecError(
        "CONTENT_TYPE_NOT_SUPPORTED", -32005, _CODE.INVALID_ARGUMENT, 415
    ),
    "VERSION_NOT_SUPPORTED": SpecError("VERSION_NOT_SUPPORTED", -32009, _CODE.UNIMPLEMENTED, 400),
    "INVALID_REQUEST": SpecError("INVALID_REQUEST", -32600, _CODE.INVALID_ARGUMENT, 400),
    "INVALID_INPUT": SpecError("INVALID_PARAMS", -32602, _CODE.INVALID_ARGUMENT, 400),
}
"""Our reason code → the spec's error. Keyed by reason, so a class is mapped by
its code wherever it is defined; a subclass inherits its nearest listed
ancestor's row (``UNKNOWN_METHOD`` is an ``INVALID_REQUEST``)."""


def spec_error_for(error: GatewayError) -> SpecError | None:
    """The spec's error for ``error``, by nearest ancestor; None if the spec has none."""
    for cls in type(error).__mro__:
        spec = SPEC_ERRORS.get(getattr(cls, "reason", ""))
        if spec is not None:
            return spec
    return None


def spec_reason_for(error: GatewayError) -> str | None:
    """The A2A spec's reason for ``error``, by nearest ancestor; None if it has none."""
    spec = spec_error_for(error)
    return None if spec is None else spec.reason


def to_a2a_status(error: GatewayError) -> grpc.Status:
    """The rich status an A2A method aborts with for ``error``."""
    code = status_code_for(error)
    detail = status_pb2.Status(code=code.value[0], message=error.remote_message)
    spec_reason = spec_reason_for(error)
    if spec_reason is not None:
        detail.details.add().Pack(
            error_details_pb2.ErrorInfo(reason=spec_reason, domain=SPEC_DOMAIN)
        )
    detail.details.add().Pack(error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN))
    return rpc_status.to_status(detail)
