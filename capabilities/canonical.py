"""Canonical JSON bytes of a capability output: the bytes its evidence digest covers.

The canonical form is, and stays, exactly what
``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
encodes to UTF-8: digests recorded by earlier versions must still match.

``orjson`` writes that same form many times faster (a 256 KB string: ~40 µs
instead of ~750 µs), but only for part of JSON: it formats some floats
differently (``1e-7`` for ``1e-07``), writes NaN as ``null`` and refuses
integers beyond 64 bits and non-string keys. So it is used only for values made
of exactly ``dict`` (string keys), ``list``, ``str``, ``int``, ``bool`` and
``None``, where the two agree byte for byte (tests/capabilities/test_canonical_json.py
compares them); anything else, and anything ``orjson`` refuses, goes the
``json`` way and gets the very bytes (or error) it always did.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})
_SORTED = orjson.OPT_SORT_KEYS


def canonical_json(value: Any, *, allow_nan: bool = True) -> bytes:
    """Deterministic JSON bytes (sorted keys, no spaces, UTF-8).

    ``allow_nan=False`` refuses NaN and infinities with ``ValueError``, as
    ``json.dumps`` does (the fast path never sees a float).
    """
    if _orjson_agrees(value):
        try:
            return orjson.dumps(value, option=_SORTED)
        except orjson.JSONEncodeError:
            pass  # e.g. an int beyond 64 bits, a lone surrogate: json decides
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
    ).encode()


class CanonicalJson(bytes):
    """:func:`canonical_json` bytes that still hold the value they encode (``value``).

    A capability's output is encoded once for its digest and the wire; a
    transport that needs it as a value again (A2A builds a ``data`` part from
    it) takes ``value`` instead of decoding 256 KB it has just encoded. The
    bytes are the bytes, whoever reads them: ``value`` is only a shortcut, the
    same JSON value (a ``dict`` of plain JSON types) that ``json.loads`` of
    these bytes makes, and must never be changed.
    """

    value: Any

    @classmethod
    def of(cls, value: Any) -> CanonicalJson:
        """``canonical_json(value)``, remembering ``value`` (plain JSON, owned from here on).

        One copy of the bytes (a ``bytes`` subclass cannot adopt the encoder's
        buffer): ~20-60 µs at 256 KB, against ~200-350 µs to decode them again.
        """
        encoded = cls(canonical_json(value))
        encoded.value = value
        return encoded


def ascii_json(value: Any, *, sort_keys: bool) -> bytes:
    """Exactly ``json.dumps(value, separators=(",", ":"), sort_keys=sort_keys).encode()``.

    The compact ASCII form (non-ASCII characters escaped) that request payloads
    have always been sent in; same bytes, same errors (``TypeError``/``ValueError``).
    Where the fast encoder's output is printable ASCII it equals that form: the
    two differ only in how they write non-ASCII text and DEL (``\\u007f`` there).
    """
    if _orjson_agrees(value):
        try:
            fast = orjson.dumps(value, option=_SORTED if sort_keys else 0)
        except orjson.JSONEncodeError:
            pass
        else:
            if fast.isascii() and b"\x7f" not in fast:
                return fast
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys).encode()


def compact_json(value: Any) -> bytes:
    """Exactly ``json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))``
    encoded to UTF-8: Starlette's ``JSONResponse`` body. Same bytes, same errors.

    Keys keep their order. The fast encoder writes that form for values made of
    the types :func:`canonical_json` trusts it with (at 256 KB ~10 µs instead of
    ~590 µs); anything else goes the ``json`` way.
    """
    if _orjson_agrees(value):
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def _orjson_agrees(value: Any) -> bool:
    """True when ``value`` holds only types both encoders write the same way."""
    pending = [value]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is dict:
            for key in node:
                if type(key) is not str:
                    return False
            pending.extend(node.values())
        elif kind is list:
            pending.extend(node)
        elif kind not in _PLAIN_LEAVES:
            return False
    return True
