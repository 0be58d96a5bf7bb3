"""The JSON Schema subset used for untrusted outputs and ``expect``."""

from __future__ import annotations

from typing import Any

import pytest

from capabilities.builtin.search import SearchOutput
from gateway.plans.document.schema import SchemaMismatch, check_schema, matches

SEARCH = SearchOutput.model_json_schema()


def test_pydantic_schema_accepts_a_real_output() -> None:
    check_schema({"items": [{"id": "d", "title": "t", "score": 2}]}, SEARCH)


@pytest.mark.parametrize(
    "value",
    [
        {"items": [{"id": "d", "title": "t", "score": 0}]},
        {"items": [{"id": "d", "title": "t"}]},
        {"items": [{"id": "d", "title": "t", "score": 1, "leak": "x"}]},
        {"items": "nope"},
        {},
        [],
    ],
)
def test_pydantic_schema_refuses_what_the_contract_forbids(value: Any) -> None:
    assert not matches(value, SEARCH)


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "integer", "minimum": 1}, 1, 0),
        ({"type": "integer"}, 1, True),
        ({"type": "string", "maxLength": 2, "pattern": "^a"}, "ab", "ba"),
        ({"enum": ["x", "y"]}, "x", "z"),
        ({"const": 3}, 3, 4),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, None, 1),
        ({"type": "array", "minItems": 1, "items": {"type": "number"}}, [1.5], []),
        ({"type": "object", "additionalProperties": {"type": "string"}}, {"a": "b"}, {"a": 1}),
    ],
)
def test_keywords(schema: dict[str, Any], good: Any, bad: Any) -> None:
    assert matches(good, schema)
    assert not matches(bad, schema)


def test_message_names_the_path_not_the_value() -> None:
    with pytest.raises(SchemaMismatch) as info:
        check_schema({"items": [{"id": "secret-value", "title": 5, "score": 1}]}, SEARCH)
    assert "$.items[0].title" in str(info.value)
    assert "secret-value" not in str(info.value)


def test_malformed_schema_fails_closed() -> None:
    assert not matches({"a": 1}, {"$ref": "#/nowhere"})
    assert not matches({"a": 1}, {"$ref": "http://elsewhere"})
    assert not matches("x", {"type": "no-such-type"})
