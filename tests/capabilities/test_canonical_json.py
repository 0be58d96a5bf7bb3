"""Canonical JSON: the fast path writes exactly the bytes json.dumps always wrote.

Evidence digests recorded by earlier versions cover ``json.dumps`` bytes, so
every value must canonicalise to those bytes (or fail the same way).
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest

from capabilities.canonical import CanonicalJson, ascii_json, canonical_json


def reference(value: Any) -> bytes:
    """The canonical form as the gateway has always defined it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_CHARS = [
    chr(code)
    for code in (*range(0x00, 0x250), 0x2028, 0x2029, 0x202E, 0xFEFF, 0xFFFD, 0xE000, 0x1F600)
]


def test_every_escape_and_non_ascii_character_matches() -> None:
    for char in _CHARS:
        value = {f"k{char}": char, char: [char * 3, 0, -1, True, False, None, 2**63 - 1]}
        assert canonical_json(value) == reference(value), repr(char)


def test_random_nested_values_match() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        text = "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 12)))
        value = {text: {"z": [text, {}, []], "a": rng.randint(-(2**64) + 1, 2**64 - 1), "é": ""}}
        assert canonical_json(value) == reference(value)


@pytest.mark.parametrize(
    "value",
    [
        {"x": 1e-07},  # orjson would write 1e-7
        {"x": 1e16},
        {"x": 0.1},
        {"x": float("nan")},  # orjson would write null
        {"x": float("inf")},
        {"x": 2**64},  # beyond orjson's integers
        {"x": -(2**63) - 1},
        {1: "int key"},  # orjson refuses non-string keys
        {"x": (1, "tuple")},
        [{"b": 1, "a": [2.5, None]}],
    ],
)
def test_values_outside_the_fast_path_get_the_same_bytes(value: Any) -> None:
    assert canonical_json(value) == reference(value)


def test_a_lone_surrogate_fails_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        reference({"x": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        canonical_json({"x": "\ud800"})


def test_keys_sort_by_code_point_at_every_depth() -> None:
    value = {"b": {"é": 1, "z": 2, "a": 3}, "a": [{"y": 1, "x": 2}], "\U0001f600": 0, "\uffff": 1}
    assert canonical_json(value) == reference(value)
    assert canonical_json(value).startswith(b'{"a":[{"x":2,"y":1}],"b":{"a":3,"z":2,')


def ascii_reference(value: Any, sort_keys: bool) -> bytes:
    """The compact ASCII form request payloads have always been sent in."""
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys).encode()


@pytest.mark.parametrize("sort_keys", [True, False])
def test_ascii_json_is_the_compact_ascii_form_for_every_character(sort_keys: bool) -> None:
    for char in _CHARS:
        value = {f"k{char}": char, "b": [char * 3, 0, -1, True, None, 2**63 - 1], char: {}}
        assert ascii_json(value, sort_keys=sort_keys) == ascii_reference(value, sort_keys)


@pytest.mark.parametrize("sort_keys", [True, False])
def test_ascii_json_random_and_odd_values_match(sort_keys: bool) -> None:
    rng = random.Random(7)
    odd: list[Any] = [{"x": 1e-07}, {"x": float("nan")}, {"x": 2**64}, {1: "k"}, {"x": "\ud800"}]
    for value in odd:
        assert ascii_json(value, sort_keys=sort_keys) == ascii_reference(value, sort_keys)
    for _ in range(1000):
        text = "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 12)))
        value = {"z": text, text: [text, {"b": 1, "a": 2}], "a": rng.randint(-(2**70), 2**70)}
        assert ascii_json(value, sort_keys=sort_keys) == ascii_reference(value, sort_keys)


def test_ascii_json_fails_as_json_dumps_does() -> None:
    with pytest.raises(TypeError):
        ascii_json({"x": object()}, sort_keys=True)
    with pytest.raises(TypeError):
        ascii_json({"b": 1, 2: "mixed keys"}, sort_keys=True)


def test_allow_nan_false_refuses_nan_and_keeps_the_fast_path() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")}, allow_nan=False)
    with pytest.raises(ValueError):
        canonical_json({"x": [float("-inf")]}, allow_nan=False)
    value = {"b": "é", "a": [1, None]}
    assert canonical_json(value, allow_nan=False) == reference(value)


@pytest.mark.parametrize(
    "value",
    [
        {"text": "x" * 300_000},
        {"n": 2**70, "m": -(2**63) - 1, "f": [1.5, -0.0, 1e-7, float("nan")], "é": None},
        {"nested": {"b": [{"c": 9007199254740993, "t": True}]}, "s": "\u2028\ufeff"},
    ],
)
def test_canonical_json_of_is_the_canonical_bytes_and_keeps_the_value(value: Any) -> None:
    encoded = CanonicalJson.of(value)
    assert bytes(encoded) == canonical_json(value) == reference(value)
    assert encoded == reference(value)  # compares as the bytes it is
    assert encoded.value is value
    assert hashlib.sha256(encoded).hexdigest() == hashlib.sha256(reference(value)).hexdigest()
