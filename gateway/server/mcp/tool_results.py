"""What a ``tools/call`` answers: a tool result, a tool error, or a JSON-RPC error.

An allowed call's output (a JSON object, as every contract's output is) is the
result's ``structuredContent`` and, for clients that read only content
blocks, one ``text`` block holding the same JSON. ``_meta`` carries the version
served, the output's evidence digest and whether the idempotency store answered
(``a2agw/version``, ``a2agw/evidence_sha256``, ``a2agw/replayed``).

A refusal or failure carries our reason code, in one of the two forms MCP
defines, as the specification assigns them:

* a JSON-RPC error where MCP says so: a tool this caller does not have (unknown
  or not granted: the two are never told apart) and a malformed call are
  ``-32602`` (invalid params); the audit log or shared state being unavailable
  is ``-32603`` (internal error); an identity or grant refused after the edge
  admitted the request is :data:`GATEWAY_REFUSAL` (``-32010``, ours);
* a tool error (``isError: true``) for everything else, from the policy's
  refusals to the capability's failures: a client's model can read it and try
  something else.

Both say ``REASON: message``; a JSON-RPC error's ``data`` is
``{"reason", "domain"}``, a tool error's ``_meta`` holds ``a2agw/reason``.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import (
    ERROR_DOMAIN,
    AuditUnavailable,
    CapabilityNotGranted,
    GatewayError,
    GrantExpired,
    InvalidRequest,
    StateUnavailable,
    Unauthenticated,
    UnknownPeer,
)
from gateway.inbound.invoke_handler import InvokeOutcome

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
GATEWAY_REFUSAL = -32010
"""Our JSON-RPC code for a refusal MCP has no code for (the reason is in ``data``).

In the range JSON-RPC leaves to servers, and none the MCP specification or its
SDKs use (``-32000`` and ``-32001`` are their clients' own)."""
REASON_META = "a2agw/reason"
"""Tool error ``_meta`` key of our reason code."""
SERVED_VERSION_META = "a2agw/version"
EVIDENCE_META = "a2agw/evidence_sha256"
REPLAYED_META = "a2agw/replayed"

_JSONRPC_CODES: dict[type[GatewayError], int] = {
    CapabilityNotGranted: INVALID_PARAMS,
    InvalidRequest: INVALID_PARAMS,
    AuditUnavailable: INTERNAL_ERROR,
    StateUnavailable: INTERNAL_ERROR,
    Unauthenticated: GATEWAY_REFUSAL,
    UnknownPeer: GATEWAY_REFUSAL,
    GrantExpired: GATEWAY_REFUSAL,
}
"""The refusals MCP answers as JSON-RPC errors (looked up along the class's ancestry)."""


def message_of(error: GatewayError) -> str:
    """``REASON: message``: what a client that keeps only the text still needs."""
    return f"{error.reason}: {error.message}"


def jsonrpc_code(error: GatewayError) -> int | None:
    """The JSON-RPC error code ``error`` is answered with; None: it is a tool error."""
    for kind in type(error).__mro__:
        code = _JSONRPC_CODES.get(kind)
        if code is not None:
            return code
    return None


def error_object(error: GatewayError, code: int) -> dict[str, Any]:
    """A JSON-RPC ``error`` member for ``error``."""
    return {
        "code": code,
        "message": message_of(error),
        "data": {"reason": error.reason, "domain": ERROR_DOMAIN},
    }


def tool_error(error: GatewayError) -> dict[str, Any]:
    """A ``CallToolResult`` that reports ``error`` (``isError: true``)."""
    return {
        "content": [{"type": "text", "text": message_of(error)}],
        "isError": True,
        "_meta": {REASON_META: error.reason},
    }


def tool_result(outcome: InvokeOutcome) -> dict[str, Any]:
    """The ``CallToolResult`` of an allowed call's output."""
    output = _output_value(outcome.payload)
    return {
        "content": answer_content(outcome.payload),
        "structuredContent": output,
        "isError": False,
        "_meta": {
            SERVED_VERSION_META: outcome.served_version,
            EVIDENCE_META: outcome.evidence_sha256,
            REPLAYED_META: outcome.remembered,
        },
    }


def answer_content(payload: bytes) -> list[dict[str, Any]]:
    """The content blocks of an output: one text block of its JSON.

    The one place content blocks are made: once a capability can answer with
    parts (text, files), they become blocks here (``text``, ``resource``),
    beside the structured output.
    """
    return [{"type": "text", "text": payload.decode("utf-8")}]


def _output_value(payload: bytes) -> Any:
    # The runner's canonical bytes keep the value they encode; a remembered answer
    # (the idempotency store's) is plain bytes.
    value = getattr(payload, "value", None)
    return value if value is not None else orjson.loads(payload)
