"""A small JSON Schema checker for untrusted outputs and ``expect`` conditions.

Covers what pydantic emits and what plans need: ``type``, ``properties``,
``required``, ``additionalProperties``, ``items``, ``enum``, ``const``,
``minLength``/``maxLength``, ``minimum``/``maximum`` (and exclusive forms),
``minItems``/``maxItems``, ``pattern``, ``anyOf``/``oneOf``/``allOf`` and local
``$ref`` into ``$defs``. An unknown keyword is ignored, as JSON Schema says;
a malformed schema counts as a failed check (fails closed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


class SchemaMismatch(ValueError):
    """The value does not satisfy the schema; the message names the path, never the value."""


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def check_schema(value: Any, schema: Any, root: dict[str, Any] | None = None) -> None:
    """Raise SchemaMismatch unless ``value`` satisfies ``schema``.

    ``root`` is the document that local ``$ref`` pointers resolve in (default:
    ``schema`` itself), for checking against a part of a larger schema.
    """
    try:
        _check(value, schema, schema if root is None else root, "$", 0)
    except (TypeError, KeyError, re.error, RecursionError) as err:
        raise SchemaMismatch(f"schema cannot be applied: {type(err).__name__}") from err


def matches(value: Any, schema: Any, root: dict[str, Any] | None = None) -> bool:
    """True if ``value`` satisfies ``schema`` (``$ref`` pointers resolved in ``root``)."""
    try:
        check_schema(value, schema, root)
    except SchemaMismatch:
        return False
    return True


_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")


def check_well_formed(schema: Any) -> None:
    """Raise SchemaMismatch naming the keyword if ``schema`` is not one this checker can apply.

    For schemas written in plans (``expect.schema``): a mistake there must be found
    before the step runs, not after (a write would already have happened).
    """
    if not isinstance(schema, dict):
        raise SchemaMismatch("$: a schema must be an object")
    _well_formed(schema, schema, "$", 0)


def _well_formed(schema: Any, root: dict[str, Any], path: str, depth: int) -> None:
    if depth > 64:
        raise SchemaMismatch(f"{path}: schema nests too deeply")
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaMismatch(f"{path}: a schema must be an object or a boolean")
    if "$ref" in schema and not _resolvable(schema["$ref"], root):
        raise SchemaMismatch(f"{path}.$ref: not a reference into this schema")
    wanted = schema.get("type", [])
    names = [wanted] if isinstance(wanted, str) else wanted
    if not isinstance(names, list) or not all(name in _TYPES for name in names):
        raise SchemaMismatch(f"{path}.type: not a JSON type (or list of them)")
    _well_formed_values(schema, path)
    for key in _SCHEMA_LISTS:
        subs = schema.get(key, [])
        if not isinstance(subs, list):
            raise SchemaMismatch(f"{path}.{key}: must be a list of schemas")
        for index, sub in enumerate(subs):
            _well_formed(sub, root, f"{path}.{key}[{index}]", depth + 1)
    for key in _SCHEMA_MAPS:
        subs = schema.get(key, {})
        if not isinstance(subs, dict):
            raise SchemaMismatch(f"{path}.{key}: must map names to schemas")
        for name, sub in subs.items():
            _well_formed(sub, root, f"{path}.{key}.{name}", depth + 1)
    for key in ("items", "additionalProperties"):
        if key in schema:
            _well_formed(schema[key], root, f"{path}.{key}", depth + 1)


def _resolvable(ref: Any, root: dict[str, Any]) -> bool:
    if not isinstance(ref, str):
        return False
    try:
        _resolve(ref, root)
    except (SchemaMismatch, KeyError, TypeError):
        return False
    return True


def _well_formed_values(schema: dict[str, Any], path: str) -> None:
    for key in _COUNTS:
        value = schema.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaMismatch(f"{path}.{key}: must be an integer")
    for key in _BOUNDS:
        value = schema.get(key, 0)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise SchemaMismatch(f"{path}.{key}: must be a number")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise SchemaMismatch(f"{path}.required: must be a list of field names")
    if not isinstance(schema.get("enum", []), list):
        raise SchemaMismatch(f"{path}.enum: must be a list")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as err:
            raise SchemaMismatch(f"{path}.pattern: not a regular expression") from err


def _check(value: Any, schema: Any, root: dict[str, Any], path: str, depth: int) -> None:
    if depth > 64:
        raise SchemaMismatch(f"{path}: schema nests too deeply")
    if schema is True or schema == {}:
        return
    if schema is False or not isinstance(schema, dict):
        raise SchemaMismatch(f"{path}: not allowed")
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, path, depth + 1)
    _check_type(value, schema, path)
    _check_combinators(value, schema, root, path, depth)
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaMismatch(f"{path}: not one of the allowed values")
    if "const" in schema and value != schema["const"]:
        raise SchemaMismatch(f"{path}: not the required constant")
    if isinstance(value, str):
        _check_string(value, schema, path)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(value, schema, path)
    elif isinstance(value, list):
        _check_array(value, schema, root, path, depth)
    elif isinstance(value, dict):
        _check_object(value, schema, root, path, depth)


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    if not ref.startswith("#/"):
        raise SchemaMismatch(f"only local references are followed, not {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _check_type(value: Any, schema: dict[str, Any], path: str) -> None:
    wanted = schema.get("type")
    if wanted is None:
        return
    names = [wanted] if isinstance(wanted, str) else list(wanted)
    if not any(_TYPES[name](value) for name in names):
        raise SchemaMismatch(f"{path}: expected {' or '.join(names)}")


def _check_combinators(
    value: Any, schema: dict[str, Any], root: dict[str, Any], path: str, depth: int
) -> None:
    for sub in schema.get("allOf", ()):
        _check(value, sub, root, path, depth + 1)
    if "anyOf" in schema and not any(_ok(value, s, root, depth) for s in schema["anyOf"]):
        raise SchemaMismatch(f"{path}: matches none of anyOf")
    if "oneOf" in schema and sum(_ok(value, s, root, depth) for s in schema["oneOf"]) != 1:
        raise SchemaMismatch(f"{path}: does not match exactly one of oneOf")


def _ok(value: Any, schema: Any, root: dict[str, Any], depth: int) -> bool:
    try:
        _check(value, schema, root, "$", depth + 1)
    except SchemaMismatch:
        return False
    return True


def _check_string(value: str, schema: dict[str, Any], path: str) -> None:
    if len(value) < schema.get("minLength", 0):
        raise SchemaMismatch(f"{path}: shorter than minLength")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise SchemaMismatch(f"{path}: longer than maxLength")
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        raise SchemaMismatch(f"{path}: does not match pattern")


def _check_number(value: float, schema: dict[str, Any], path: str) -> None:
    bounds: tuple[tuple[str, Callable[[float], bool]], ...] = (
        ("minimum", lambda bound: value < bound),
        ("maximum", lambda bound: value > bound),
        ("exclusiveMinimum", lambda bound: value <= bound),
        ("exclusiveMaximum", lambda bound: value >= bound),
    )
    for key, broken in bounds:
        if key in schema and broken(schema[key]):
            raise SchemaMismatch(f"{path}: violates {key}")


def _check_array(
    value: list[Any], schema: dict[str, Any], root: dict[str, Any], path: str, depth: int
) -> None:
    if len(value) < schema.get("minItems", 0):
        raise SchemaMismatch(f"{path}: fewer than minItems")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise SchemaMismatch(f"{path}: more than maxItems")
    if "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], root, f"{path}[{index}]", depth + 1)


def _check_object(
    value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], path: str, depth: int
) -> None:
    for name in schema.get("required", ()):
        if name not in value:
            raise SchemaMismatch(f"{path}: missing required field {name!r}")
    properties: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            _check(item, properties[name], root, f"{path}.{name}", depth + 1)
        elif extra is False:
            raise SchemaMismatch(f"{path}: unexpected field {name!r}")
        elif isinstance(extra, dict):
            _check(item, extra, root, f"{path}.{name}", depth + 1)
