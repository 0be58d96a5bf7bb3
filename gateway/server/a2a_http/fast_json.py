"""The a2a-sdk's HTTP routes read and write JSON with orjson wherever that gives the same result.

The SDK's JSON-RPC and REST routes answer with Starlette's ``JSONResponse``
(``json.dumps(..., ensure_ascii=False, allow_nan=False)``) and the JSON-RPC
route reads its body with ``Request.json()`` (``json.loads``). At 256 KB those
cost ~590 µs and ~180 µs of every call; orjson does the same in ~10 µs and ~80
µs. The wire is unchanged:

* a response body is byte for byte what ``JSONResponse`` writes
  (:func:`capabilities.canonical.compact_json`, which falls back to ``json``
  for any value the two encoders could write differently);
* a request body becomes the very value ``json.loads`` makes of it: orjson
  only when its answer holds no float (it reads integers beyond 64 bits as
  floats) and it accepts the text; otherwise ``json.loads`` decides, with its
  own leniency (NaN, a BOM, lone surrogates) and its own errors.

:func:`use_fast_json` points the SDK's route modules at these two classes (it
replaces their module-level ``JSONResponse`` / ``A2AJSONResponse`` names);
the edge builds the requests it hands the routes as :class:`ParsedJsonRequest`.
Those names are module-wide: any other a2a-sdk server in the same process
answers through the same classes from then on (the same bytes, sooner).
tests/server/a2a_http/test_fast_json.py checks the names are still
there, and compares both directions with ``json`` on odd values.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from a2a.server.routes import jsonrpc_dispatcher, rest_dispatcher
from starlette.requests import Request
from starlette.responses import JSONResponse

from capabilities.canonical import compact_json


class _CompactRender:
    """``render`` by :func:`compact_json`: the bytes ``JSONResponse.render`` writes, sooner."""

    def render(self, content: Any) -> bytes:
        return compact_json(content)


class CompactJsonResponse(_CompactRender, JSONResponse):
    """``JSONResponse`` whose body is rendered by :func:`compact_json` (same bytes)."""


_SDK_REST_RESPONSE: type[JSONResponse] = getattr(rest_dispatcher, "A2AJSONResponse")  # noqa: B009
"""The REST route's own response class (``application/a2a+json``, say), named only at run time."""


class _RestJsonResponse(_CompactRender, _SDK_REST_RESPONSE):  # type: ignore[misc,valid-type]
    """The REST route's response class (its media type kept), rendered the same way."""


def json_value(body: bytes) -> Any:
    """Exactly ``json.loads(body)``: its value, or its error."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)
    return json.loads(body) if _holds_float(value) else value


def _holds_float(value: Any) -> bool:
    pending = [value]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is float:
            return True
        if kind is dict:
            pending.extend(node.values())
        elif kind is list:
            pending.extend(node)
    return False


class ParsedJsonRequest(Request):
    """A Starlette ``Request`` whose ``json()`` is :func:`json_value` of its body."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json_value(await self.body())
        return self._json


def use_fast_json() -> None:
    """Have the SDK's JSON-RPC and REST routes answer through :func:`compact_json`."""
    setattr(jsonrpc_dispatcher, "JSONResponse", CompactJsonResponse)  # noqa: B010
    setattr(rest_dispatcher, "A2AJSONResponse", _RestJsonResponse)  # noqa: B010
