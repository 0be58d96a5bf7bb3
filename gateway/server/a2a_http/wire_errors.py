"""GatewayError → the error each HTTP binding of A2A 1.0 answers with.

Both bindings carry the same facts as the gRPC status (``gateway.server.a2a.wire_errors``):

- JSON-RPC: ``error.code`` is the spec's code where the spec defines the error
  (``-32001`` TASK_NOT_FOUND ... ``-32009`` VERSION_NOT_SUPPORTED, ``-32600``
  INVALID_REQUEST, ``-32602`` INVALID_PARAMS), else ``-32000``; ``error.data``
  is a list of ``google.rpc.ErrorInfo`` objects.
- HTTP+JSON: the spec's HTTP status where the spec defines the error (its
  table 5.4: ``409`` TASK_NOT_CANCELABLE, ``415`` CONTENT_TYPE_NOT_SUPPORTED,
  ...), else the HTTP status of the gRPC code (AIP-193), and a body
  ``{"error": {code, status, message, details}}`` in the ``google.rpc.Status``
  JSON form, as ``application/a2a+json`` (``media_types.REST_MEDIA_TYPE``).

``details``/``data``: the spec's ``ErrorInfo`` (domain ``a2a-protocol.org``)
first, where there is one, since the a2a-sdk clients read only the first;
then ours (``domain="a2agw.v1"``, ``reason`` = our reason code). Every
``ErrorInfo`` carries our reason in ``metadata["a2agw.reason"]``, and every
message starts with ``REASON: `` as well, because a client of another SDK may
keep nothing but the message.

A2A 0.3 JSON-RPC clients (``[a2a] v0_3_compat``) get the 0.3 form: a code the
0.3 specification defines (else ``-32000``), and ``error.data`` an object, as
0.3 clients decode it (a2a-go: ``map[string]any``, appending ``data.error`` to
its error): ``{"error": "REASON: message", "reason", "domain", "details"}``.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.errors import ERROR_DOMAIN, GatewayError, error_for_reason
from gateway.server.a2a.wire_errors import SPEC_DOMAIN, spec_error_for, spec_reason_for
from gateway.transport.status import status_code_for

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
REASON_METADATA = "a2agw.reason"
"""``ErrorInfo.metadata`` key holding our reason code."""
GATEWAY_REFUSAL_CODE = -32000
"""JSON-RPC code of a refusal the spec defines no code for (the reason is in ``data``)."""
V0_3_JSONRPC_CODES = frozenset({-32700, -32600, -32601, -32602, -32603, *range(-32007, -32000)})
"""The JSON-RPC error codes A2A 0.3 defines (1.0 added -32008, -32009)."""

HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""gRPC code → HTTP status (google.rpc mapping); anything else is 500."""


def from_grpc_status(status: grpc.Status) -> GatewayError:
    """The GatewayError a servicer aborted with (``to_a2a_status`` read back)."""
    for key, value in status.trailing_metadata or ():
        if key == rpc_status.GRPC_DETAILS_METADATA_KEY and isinstance(value, bytes):
            detail = status_pb2.Status.FromString(value)
            for packed in detail.details:
                info = error_details_pb2.ErrorInfo()
                if packed.Unpack(info) and info.domain == ERROR_DOMAIN:
                    return error_for_reason(info.reason)(detail.message)
    return GatewayError(str(status.details or "internal error"))


def error_infos(error: GatewayError) -> list[dict[str, Any]]:
    """The ``ErrorInfo`` objects (JSON form) of ``error``: the spec's first, then ours."""
    metadata = {REASON_METADATA: error.reason}
    infos = []
    spec_reason = spec_reason_for(error)
    if spec_reason is not None:
        infos.append(_info(spec_reason, SPEC_DOMAIN, metadata))
    infos.append(_info(error.reason, ERROR_DOMAIN, metadata))
    return infos


def _info(reason: str, domain: str, metadata: dict[str, str]) -> dict[str, Any]:
    return {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": domain, "metadata": metadata}


def message_of(error: GatewayError) -> str:
    """``REASON: message``: what a client that keeps only the message still needs."""
    return f"{error.reason}: {error.message}"


def jsonrpc_code(error: GatewayError) -> int:
    """The JSON-RPC error code of ``error``."""
    spec = spec_error_for(error)
    return GATEWAY_REFUSAL_CODE if spec is None else spec.jsonrpc


def jsonrpc_error(error: GatewayError, request_id: str | int | None) -> dict[str, Any]:
    """A whole JSON-RPC 2.0 error response for ``error``."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": jsonrpc_code(error),
            "message": message_of(error),
            "data": error_infos(error),
        },
    }


def v0_3_error_data(error: GatewayError) -> dict[str, Any]:
    """``error.data`` for an A2A 0.3 client: an object, our reason in ``reason`` and ``error``."""
    return {
        "error": message_of(error),
        "reason": error.reason,
        "domain": ERROR_DOMAIN,
        "details": error_infos(error),
    }


def jsonrpc_v0_3_error(
    error: GatewayError, request_id: str | int | None, code: int | None = None
) -> dict[str, Any]:
    """A whole JSON-RPC 2.0 error response for an A2A 0.3 client (``code``: the SDK's, if any)."""
    code = jsonrpc_code(error) if code is None else code
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": code if code in V0_3_JSONRPC_CODES else GATEWAY_REFUSAL_CODE,
            "message": message_of(error),
            "data": v0_3_error_data(error),
        },
    }


def http_status(error: GatewayError) -> int:
    """The HTTP status of ``error`` on the HTTP+JSON binding."""
    spec = spec_error_for(error)
    return spec.http if spec is not None else HTTP_STATUS.get(status_code_for(error), 500)


def rest_error(error: GatewayError) -> dict[str, Any]:
    """The HTTP+JSON error body (``google.rpc.Status`` JSON form) for ``error``."""
    code = status_code_for(error)
    return {
        "error": {
            "code": http_status(error),
            "status": code.name,
            "message": message_of(error),
            "details": error_infos(error),
        }
    }
