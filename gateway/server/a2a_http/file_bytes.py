"""File parts' bytes on the JSON bindings: base64 or refused.

protobuf's JSON parser reads a ``bytes`` field leniently: it pads, accepts both
alphabets (as the proto3 JSON mapping says) and silently drops every character
outside them, so ``"raw": "!!!!"`` reached a capability as an empty file and
was audited as allowed. A file part whose bytes are not base64 is malformed
input: refused ``INVALID_REQUEST`` before the SDK parses it, never quoted.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.errors import InvalidRequest

_BASE64 = re.compile(r"[A-Za-z0-9+/_-]*={0,2}")
"""RFC 4648's standard and URL-safe alphabets, optional padding (proto3 JSON's bytes)."""

NOT_BASE64 = "a file part's bytes are not base64 (RFC 4648, standard or URL-safe alphabet)"


def check_file_bytes(body: bytes) -> None:
    """Refuse a SendMessage body whose file part's bytes are not base64.

    Only a body that names ``"raw"`` (1.0) or ``"bytes"`` (0.3) is parsed: a
    data-only message pays two substring scans. A body that is not JSON is
    left to the SDK, which refuses it.
    """
    if b'"raw"' not in body and b'"bytes"' not in body:
        return
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    for encoded in _file_bytes(value):
        if not is_base64(encoded):
            raise InvalidRequest(NOT_BASE64)


def is_base64(encoded: str) -> bool:
    """True when ``encoded`` is base64 as proto3 JSON writes bytes (padding optional)."""
    if _BASE64.fullmatch(encoded) is None:
        return False
    unpadded = len(encoded.rstrip("="))
    if unpadded % 4 == 1:
        return False
    return len(encoded) == unpadded or len(encoded) % 4 == 0


def _file_bytes(value: Any) -> list[str]:
    """The bytes strings of the message's parts: 1.0 ``raw``, 0.3 ``file.bytes``."""
    if not isinstance(value, dict):
        return []
    params = value.get("params")
    message = (params if isinstance(params, dict) else value).get("message")
    parts = message.get("parts") if isinstance(message, dict) else None
    if not isinstance(parts, list):
        return []
    found = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        raw = part.get("raw")
        file = part.get("file")
        encoded = file.get("bytes") if isinstance(file, dict) else None
        found += [text for text in (raw, encoded) if isinstance(text, str)]
    return found
