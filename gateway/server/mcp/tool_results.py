"""What a ``tools/call`` answers: a tool result, a tool error, or a JSON-RPC error.

An allowed call's output (a JSON object, as every contract's output is) is the
result's ``structuredContent`` and, for clients that read only content
blocks, one ``text`` block holding the same JSON. A reply
(``TaskReply``/``MessageReply``) is content blocks, one per part
(:func:`reply_content`), and ``structuredContent`` only when it holds exactly
one data part (that part). ``_meta`` carries the version
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

from capabilities.replies import REPLY_KEY
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
    result: dict[str, Any] = {
        "content": answer_content(outcome.payload),
        "structuredContent": output,
        "isError": False,
        "_meta": {
            SERVED_VERSION_META: outcome.served_version,
            EVIDENCE_META: outcome.evidence_sha256,
            REPLAYED_META: outcome.remembered,
        },
    }
    if isinstance(output, dict) and REPLY_KEY in output:  # a TaskReply or MessageReply
        result["content"] = reply_content(output)
        data = [part["data"] for part in _reply_parts(output) if part.get("kind") == "data"]
        if len(data) == 1:  # what an output schema describes, if the tool declares one
            result["structuredContent"] = data[0]
        else:
            del result["structuredContent"]
    return result


def answer_content(payload: bytes) -> list[dict[str, Any]]:
    """The content blocks of an output object: one text block of its JSON (a reply's
    parts: :func:`reply_content`)."""
    return [{"type": "text", "text": payload.decode("utf-8")}]


def reply_content(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of a reply's canonical JSON (:mod:`capabilities.replies`).

    A TaskReply's final text first, then each part in order: text as ``text``,
    a data part as ``text`` holding its JSON, file bytes as an embedded
    ``resource`` (``blob``, base64 as the reply holds it; its ``uri`` names the
    part: ``a2agw:part/<n>/<name>``), a URL as a ``resource_link`` (never fetched).
    """
    blocks: list[dict[str, Any]] = []
    if reply.get("text"):
        blocks.append({"type": "text", "text": reply["text"]})
    for n, part in enumerate(_reply_parts(reply)):
        kind = part.get("kind")
        if kind == "text":
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "data":
            blocks.append({"type": "text", "text": orjson.dumps(part["data"]).decode("utf-8")})
        elif kind == "file":
            resource = {"uri": f"a2agw:part/{n}/{part.get('name', '')}", "blob": part["bytes"]}
            if part.get("media_type"):
                resource["mimeType"] = part["media_type"]
            blocks.append({"type": "resource", "resource": resource})
        elif kind == "url":
            link = {"type": "resource_link", "uri": part["url"], "name": part.get("name") or ""}
            if part.get("media_type"):
                link["mimeType"] = part["media_type"]
            blocks.append(link)
    return blocks


def _reply_parts(reply: dict[str, Any]) -> list[dict[str, Any]]:
    if reply.get(REPLY_KEY) == "message":
        return list(reply.get("parts", []))
    return [part for artifact in reply.get("artifacts", []) for part in artifact["parts"]]


def _output_value(payload: bytes) -> Any:
    # The runner's canonical bytes keep the value they encode; a remembered answer
    # (the idempotency store's) is plain bytes.
    value = getattr(payload, "value", None)
    return value if value is not None else orjson.loads(payload)
