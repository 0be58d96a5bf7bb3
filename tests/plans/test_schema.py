"""JSON Schema checks of untrusted outputs and ``expect``: jsonschema, held to our rules."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from capabilities.builtin.search import SearchOutput
from gateway.plans.document.schema import (
    MAX_DEPTH,
    MAX_SUBSCHEMAS,
    SchemaMismatch,
    check_schema,
    check_well_formed,
    matches,
)

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


def test_an_integer_is_a_number_without_a_fraction_part() -> None:
    assert matches(3, {"type": "integer"})
    assert not matches(3.0, {"type": "integer"})
    assert not matches(True, {"type": "integer"})
    assert matches(3.0, {"type": "number"})


def test_enum_and_const_tell_a_boolean_from_a_number() -> None:
    assert not matches(True, {"enum": [1]})
    assert not matches(1, {"const": True})
    assert matches(1.0, {"const": 1})


@pytest.mark.parametrize(
    ("schema", "value", "message"),
    [
        (
            SEARCH,
            {"items": [{"id": "d", "title": "t", "score": 1, "secret-key": "s"}]},
            "$.items[0]: violates additionalProperties",
        ),
        (
            SEARCH,
            {"items": [{"title": "secret", "score": 1}]},
            "$.items[0]: violates required ('id' is missing)",
        ),
        ({"additionalProperties": {"type": "string"}}, {"secret-key": 5}, "$.*: violates type"),
        ({"properties": {"a": {"enum": ["x"]}}}, {"a": "secret"}, "$.a: violates enum"),
        ({"items": {"pattern": "^a"}}, ["ok", "secret"], "$[0]: violates pattern"),
        ({"const": "x"}, "secret", "$: violates const"),
        ({"not": {"type": "string"}}, "secret", "$: violates not"),
    ],
)
def test_a_message_names_path_and_keyword_never_a_value_or_an_undeclared_key(
    schema: dict[str, Any], value: Any, message: str
) -> None:
    with pytest.raises(SchemaMismatch) as info:
        check_schema(value, schema)
    assert str(info.value) == message
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"uniqueItems": True}, [1, 2], [1, 1]),
        ({"multipleOf": 3}, 6, 7),
        ({"not": {"type": "null"}}, 1, None),
        ({"minProperties": 1}, {"a": 1}, {}),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "ab", "a"),
        ({"propertyNames": {"pattern": "^[a-z]+$"}}, {"ab": 1}, {"A": 1}),
        ({"contains": {"const": 1}}, [0, 1], [0]),
    ],
)
def test_keywords_earlier_releases_ignored_now_refuse(
    schema: dict[str, Any], good: Any, bad: Any
) -> None:
    assert matches(good, schema)
    assert not matches(bad, schema)


def test_a_part_of_a_larger_schema_resolves_its_refs_in_the_whole() -> None:
    items = SEARCH["properties"]["items"]
    assert matches([{"id": "d", "title": "t", "score": 1}], items, SEARCH)
    assert not matches([{"id": "d", "title": "t", "score": 0}], items, SEARCH)


@pytest.mark.parametrize(
    "keyword",
    ["$schema", "$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$vocabulary"],
)
def test_keywords_that_move_references_or_the_dialect_fail_closed(keyword: str) -> None:
    # e.g. "$schema": draft-04 would switch the validator to another dialect's rules.
    schema = {"properties": {"a": {keyword: "http://json-schema.org/draft-04/schema#"}}}
    with pytest.raises(
        SchemaMismatch,
        match=rf"^schema cannot be applied: \$\.properties\.a\.\{keyword}: not supported$",
    ):
        check_schema({"a": 1}, schema)
    with pytest.raises(SchemaMismatch, match="not supported"):
        check_well_formed(schema)


class Listener:
    """A loopback TCP socket that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/schema.json"

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


def test_a_remote_reference_is_never_fetched() -> None:
    listener = Listener()
    try:
        direct = {"$ref": listener.url}
        # Reached only through a local pointer into a place no check walks
        # (a default): the validator's own registry must still refuse it.
        hidden = {"$ref": "#/default", "default": {"$ref": listener.url}}
        for schema in (direct, hidden):
            with pytest.raises(SchemaMismatch, match=r"^schema cannot be applied"):
                check_schema({"a": 1}, schema)
        with pytest.raises(SchemaMismatch, match=r"^\$\.\$ref: not a reference into this schema$"):
            check_well_formed(direct)
        assert listener.connections() == 0
    finally:
        listener.sock.close()


def nested(levels: int, leaf: Any, wrap: Any) -> Any:
    for _ in range(levels):
        leaf = wrap(leaf)
    return leaf


def test_values_and_schemas_are_bounded() -> None:
    assert matches(nested(MAX_DEPTH, 1, lambda x: [x]), {})
    with pytest.raises(SchemaMismatch, match=r"^\$: nests deeper than 64 levels$"):
        check_schema(nested(MAX_DEPTH + 1, 1, lambda x: {"a": x}), {})
    assert matches(1, nested(MAX_DEPTH, {}, lambda s: {"allOf": [s]}))
    too_deep = nested(MAX_DEPTH + 1, {}, lambda s: {"allOf": [s]})
    with pytest.raises(SchemaMismatch, match="nests too deeply or is too large"):
        check_schema(1, too_deep)
    too_wide = {"anyOf": [{"type": "string"}] * MAX_SUBSCHEMAS}
    with pytest.raises(SchemaMismatch, match="nests too deeply or is too large"):
        check_schema(1, too_wide)
    for loop in (
        {"$ref": "#"},
        {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
    ):
        with pytest.raises(SchemaMismatch, match=r"^schema cannot be applied: RecursionError$"):
            check_schema({"a": 1}, loop)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {"patternProperties": {"^x": {}}, "additionalProperties": False},
            "$.patternProperties: not supported beside additionalProperties",
        ),
        (
            {"prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
            "$.prefixItems: not supported beside items",
        ),
        ({"minLength": -1}, "$.minLength: not a valid minLength"),
        ({"items": [{"type": "string"}]}, "$.items: a schema must be an object or a boolean"),
        ([], "$: a schema must be an object"),
    ],
)
def test_an_expect_schema_that_would_check_less_or_nothing_is_refused(
    schema: Any, problem: str
) -> None:
    with pytest.raises(SchemaMismatch) as info:
        check_well_formed(schema)
    assert str(info.value) == problem


@pytest.mark.parametrize(
    "schema",
    [
        SEARCH,
        {"patternProperties": {"^x": {"type": "string"}}},
        {"prefixItems": [{"type": "string"}]},
        {"type": "object", "title": "T", "description": "d", "format": "x", "x-note": 1},
        {"uniqueItems": True, "not": {"const": []}},
    ],
)
def test_a_well_formed_expect_schema_passes(schema: dict[str, Any]) -> None:
    check_well_formed(schema)
