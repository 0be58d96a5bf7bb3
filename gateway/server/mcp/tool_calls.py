"""``tools/call`` ⇄ the protocol-neutral call, and back to a tool result.

A call becomes one :class:`~gateway.inbound.call.InvokeCall` that takes the
whole decision path (``InvokeHandler.admit``, then ``run``), exactly as an A2A
``SendMessage`` does:

* capability: the tool ``name``;
* payload: ``arguments`` as compact JSON (``{}`` if absent): the payload cap,
  the input contract and the audit digest apply to those bytes;
* request id (replay protection): ``_meta["a2agw/request_id"]`` when the
  client sends one, else a fresh id. A JSON-RPC id is no request id: MCP
  clients number their requests from zero on every connection, so the same id
  comes back from the same caller all the time. A client that wants a retry
  refused as ``REPLAYED_REQUEST`` sends its own id;
* idempotency key: ``_meta["a2agw/idempotency_key"]``;
* version constraint: ``_meta["a2agw/version"]`` (``^1``, ``1.2.0``; default:
  the highest version granted);
* ``_meta`` keys that claim who is calling (``a2agw/peer`` ...) are refused
  ``UNAUTHENTICATED``; any other ``a2agw/`` key, or one that is not a string,
  is refused ``INVALID_REQUEST``. Other ``_meta`` keys (``progressToken``, the
  2026 envelope's) are MCP's and left alone, but a ``progressToken`` that is
  not a string or a number is refused ``INVALID_REQUEST``.

Progress: a capability's ``ctx.report_progress(text)`` becomes one
``notifications/progress`` for the call's ``progressToken`` (``progress``
counts the reports, ``message`` is the text). ``ctx.emit_chunk`` sends
nothing: MCP has no partial results; the output comes whole in the answer.
``ctx.ask_input`` fails the call (``CAPABILITY_FAILED``): a tool call has no
next message to answer with. A capability that takes no data part is no tool
(``arguments`` are one JSON object, a data part): ``tools/list`` leaves it
out and a call to it is refused ``CONTENT_TYPE_NOT_SUPPORTED`` (audited).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from pydantic import BaseModel

from capabilities.context import AskState, CallEvents
from capabilities.parts import Part
from gateway.errors import GatewayError
from gateway.identity import PresentedTokens
from gateway.inbound.call import InvokeCall, deadline_from
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.inbound.pipeline import EdgeSlot
from gateway.server.mcp.tool_results import jsonrpc_code, tool_error, tool_result

REQUEST_ID_META = "a2agw/request_id"
IDEMPOTENCY_KEY_META = "a2agw/idempotency_key"
VERSION_CONSTRAINT_META = "a2agw/version"
IDENTITY_META = frozenset({"a2agw/peer", "a2agw/identity", "a2agw/spiffe_id", "a2agw/caller"})
"""``_meta`` keys that would name the caller: refused, whatever their value (UNAUTHENTICATED)."""
_OURS = "a2agw/"
_KNOWN = frozenset({REQUEST_ID_META, IDEMPOTENCY_KEY_META, VERSION_CONSTRAINT_META})

Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Sends one notification (method, params) on the call's response stream."""


class JsonRpcRefusal(Exception):
    """A refusal MCP answers as a JSON-RPC error (``code``), not as a tool error."""

    def __init__(self, error: GatewayError, code: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.code = code


class ProgressEvents(CallEvents):
    """A capability's progress reports as ``notifications/progress`` for one token."""

    def __init__(self, token: str | int, notify: Notify) -> None:
        self._token = token
        self._notify = notify
        self._count = 0

    async def progress(self, text: str) -> None:
        """One progress notification: ``progress`` counts the reports, ``message`` is ``text``."""
        self._count += 1
        params = {"progressToken": self._token, "progress": self._count, "message": text}
        await self._notify("notifications/progress", params)

    async def chunk(self, data: dict[str, Any] | str) -> None:
        """Nothing: MCP has no partial results (the output comes whole in the answer)."""

    async def ask(
        self, prompt: tuple[Part, ...], state: AskState, schema: type[BaseModel] | None
    ) -> Any:
        """Refused: a ``tools/call`` has no next message to answer with (A2A tasks only).

        Raises:
            RuntimeError: always (the capability fails ``CAPABILITY_FAILED``).
        """
        raise RuntimeError("ctx.ask_input works only over A2A: an MCP tool call cannot answer it")


def invoke_call(
    peer_cert_pem: bytes | None, params: Mapping[str, Any], tokens: PresentedTokens | None = None
) -> InvokeCall:
    """The call a ``tools/call``'s params (already valid for MCP) stand for; ``tokens``: the
    bearer tokens the request presented (verified once, at the edge)."""
    meta = params.get("_meta") or {}
    problem, claimed = _meta_problem(meta)
    arguments = params.get("arguments")
    payload = orjson.dumps(arguments if arguments is not None else {})
    request_id = meta.get(REQUEST_ID_META)
    return InvokeCall(
        peer_cert_pem,
        request_id if isinstance(request_id, str) else uuid.uuid4().hex,
        str(params["name"]),
        _text(meta, VERSION_CONSTRAINT_META),
        payload,
        deadline_from(None, 0),
        idempotency_key=_text(meta, IDEMPOTENCY_KEY_META),
        problem=problem,
        claimed_identity=claimed,
        tokens=tokens,
    )


async def answer_call(
    handler: InvokeHandler,
    call: InvokeCall,
    edge_slot: EdgeSlot,
    events: CallEvents | None,
) -> dict[str, Any]:
    """Admit and run ``call``; its ``CallToolResult`` (a tool error for most refusals).

    Raises:
        JsonRpcRefusal: a refusal MCP answers as a JSON-RPC error.
    """
    try:
        admitted = await handler.admit(call, edge_slot=edge_slot)
        outcome = await handler.run(admitted, events)
    except GatewayError as err:
        code = jsonrpc_code(err)
        if code is not None:
            raise JsonRpcRefusal(err, code) from err
        return tool_error(err)
    return tool_result(outcome)


def _meta_problem(meta: Mapping[str, Any]) -> tuple[str, str]:
    """(problem, claimed identity key) of a call's ``_meta``; ("", "") when it is fine."""
    token = meta.get("progressToken")
    if token is not None and (isinstance(token, bool) or not isinstance(token, str | int | float)):
        return "_meta progressToken must be a string or a number", ""
    for key, value in meta.items():
        if not key.startswith(_OURS):
            continue
        if key in IDENTITY_META:
            return "", key
        if key not in _KNOWN:
            return f"_meta key {key[:64]!r} is not one of {sorted(_KNOWN)}", ""
        if not isinstance(value, str):
            return f"_meta {key} must be a string", ""
    return "", ""


def _text(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key, "")
    return value if isinstance(value, str) else ""
