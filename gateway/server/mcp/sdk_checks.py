"""The MCP SDK's own checks of a ``tools/list`` or ``tools/call`` request, before ours.

The edge answers these two methods itself, so it runs the checks the SDK's
server would run on them, with the SDK's functions, and answers a refusal as
the SDK does:

* the era: a ``MCP-Protocol-Version`` header naming a handshake revision
  (2025-11-25 and earlier), or none, is the handshake era; any other value is
  the 2026-07-28 era, whose ladder then refuses a version it does not serve;
* ``Accept`` must take ``application/json`` (``406``); ``Content-Type`` must
  be ``application/json`` (``415``; ``400`` in the 2026 era), so a form a web
  page posts never runs a tool;
* the JSON-RPC envelope (``400``, ``-32600``); in the 2026 era also its
  ``_meta`` envelope and the ``Mcp-Method`` and ``Mcp-Name`` headers, once
  each (``HEADER_MISMATCH``, ``-32020``: the SDK's ``classify_inbound_request``);
* the params, for the method and revision (``-32602``; ``-32601`` for a method
  the revision has not).

A JSON-RPC error is answered with ``200`` in the handshake era (as the SDK's
server does), and with the 2026 era's HTTP status for its code there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.server.streamable_http import check_accept_headers
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JSONRPCRequest,
    methods,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request


@dataclass(frozen=True, slots=True)
class ProtocolRefusal:
    """How the SDK would refuse a request.

    Attributes:
        problem: What is wrong (the audit detail; never the request's content).
        status: The HTTP status.
        error: The JSON-RPC ``error`` member (None: an empty body).
    """

    problem: str
    status: int
    error: dict[str, Any] | None = None


def error_status(code: int, modern: bool) -> int:
    """The HTTP status of a JSON-RPC error: the 2026 era's table (200 where it has none),
    200 in the handshake era."""
    return ERROR_CODE_HTTP_STATUS.get(code, 200) if modern else 200


def checked_era(request: Request, message: dict[str, Any]) -> bool | ProtocolRefusal:
    """True for a 2026-07-28 request, False for a handshake-era one, once the SDK's checks
    pass; else how the SDK refuses it."""
    headers = request.headers
    stated = headers.get("mcp-protocol-version")
    modern = stated is not None and stated not in HANDSHAKE_PROTOCOL_VERSIONS
    has_json, _ = check_accept_headers(request)
    if not has_json:
        return ProtocolRefusal("the client must accept application/json", 406)
    if not _json_content(headers.get("content-type", "")):
        # The SDK's answers: 415 in the handshake era, its security check's 400 in the 2026 one.
        return ProtocolRefusal("Content-Type must be application/json", 400 if modern else 415)
    rejection = _envelope_rejection(message, request, modern)
    if rejection is not None:
        error: dict[str, Any] = {"code": rejection.code, "message": rejection.message}
        if rejection.data is not None:
            error["data"] = rejection.data
        status = ERROR_CODE_HTTP_STATUS.get(rejection.code, 400)
        return ProtocolRefusal(rejection.message, status, error)
    version = stated if stated is not None else DEFAULT_NEGOTIATED_VERSION
    try:
        methods.validate_client_request(message["method"], version, message.get("params"))
    except KeyError:
        problem, code = f"{message['method']} is not a method of MCP {version}", METHOD_NOT_FOUND
    except ValidationError:
        problem, code = "Invalid request parameters", INVALID_PARAMS
    else:
        return modern
    error = {"code": code, "message": problem}
    return ProtocolRefusal(problem, error_status(code, modern), error)


def _json_content(content_type: str) -> bool:
    return any(part.strip() == "application/json" for part in content_type.split(";")[0].split(","))


def _envelope_rejection(
    message: dict[str, Any], request: Request, modern: bool
) -> InboundLadderRejection | None:
    """The JSON-RPC envelope and, in the 2026 era, its ``_meta`` envelope and headers."""
    # Both eras as one request: the edge answers only messages with an ``id``, and one
    # that is no request id (null, a boolean, a fraction, an object) is no request (the
    # SDK would read the message as a notification, and run nothing for it).
    try:
        JSONRPCRequest.model_validate(message)
    except ValidationError:
        return InboundLadderRejection(
            code=INVALID_REQUEST,
            message="Body must be a single JSON-RPC request or notification object",
        )
    if not modern:
        return None
    duplicated = find_duplicated_routing_header(request.headers.items())
    if duplicated is not None:
        message_text = f"{duplicated} header appears more than once"
        return InboundLadderRejection(code=HEADER_MISMATCH, message=message_text)
    verdict = classify_inbound_request(message, headers=dict(request.headers))
    return verdict if isinstance(verdict, InboundLadderRejection) else None
