"""JSON Schema checks of untrusted outputs and of ``expect`` conditions.

Outputs of peers are untrusted, and so are the output and input schemas peers
advertise; ``expect`` schemas are the operator's. All are applied by the
``jsonschema`` library's Draft 2020-12 validator, held to what the gateway
promises about them:

* A message names the JSON path and the violated keyword, never a value: an
  object key the schema does not declare in any ``properties`` shows as ``*``.
* Only ``$ref`` into the same schema (a JSON pointer, ``#/...``) is followed.
  The validator's registry retrieves nothing, so no reference is ever fetched.
* What would change how references or the dialect resolve (``$schema``,
  ``$id``, ``$anchor``, ``$dynamicRef``, ``$dynamicAnchor``, ``$recursiveRef``,
  ``$recursiveAnchor``, ``$vocabulary``) is refused.
* ``integer`` is a JSON number without a fraction part (``1.0`` is not one);
  ``format`` is an annotation, not checked.
* Bounded: a schema nested deeper than :data:`MAX_DEPTH` levels or holding more
  than :data:`MAX_SUBSCHEMAS` subschemas, or a value nested deeper than
  :data:`MAX_DEPTH` levels, fails the check; so does any schema the validator
  cannot apply (fails closed).

Every Draft 2020-12 keyword applies. Earlier releases applied a subset (``type``,
``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``,
``const``, the length, bound and item-count keywords, ``pattern``,
``anyOf``/``oneOf``/``allOf``, local ``$ref``) and ignored the rest: the others
(``not``, ``if``/``then``/``else``, ``uniqueItems``, ``multipleOf``,
``contains``, ``propertyNames``, ``dependentRequired``, ``dependentSchemas``,
``minProperties``/``maxProperties``, ``unevaluatedProperties``/``Items``) only
refuse more. The two that also accept more, ``patternProperties`` (fields
``additionalProperties`` no longer covers) and ``prefixItems`` (items ``items``
no longer covers), are refused in an ``expect`` schema beside the keyword they
narrow, so no plan's check becomes laxer than it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import extend
from referencing import Registry
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import DRAFT202012

MAX_DEPTH = 64
"""Most levels of nesting of a schema (its subschemas) and of a value checked against one."""
MAX_SUBSCHEMAS = 10_000
"""Most subschemas one schema may hold (an advertised schema is untrusted input)."""

_REFUSED_KEYWORDS = (
    "$schema",
    "$id",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
)
"""Keywords that move where references resolve or which dialect applies."""
_WIDENING = {"patternProperties": "additionalProperties", "prefixItems": "items"}
"""Keyword → the keyword whose reach it narrows (accepting more than before)."""
_SCHEMA_VALUED = (
    "additionalProperties",
    "items",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_WELL_FORMED_PHRASES = {
    "type": "not a JSON type (or list of them)",
    "pattern": "not a regular expression",
    "required": "must be a list of field names",
}


class SchemaMismatch(ValueError):
    """The value does not satisfy the schema; the message names the path, never the value."""


def _never_fetch(uri: str) -> NoReturn:
    # A reference outside the schema is refused before validation; were one to
    # get this far, it fails here rather than being fetched.
    raise NoSuchResource(uri)


_NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_never_fetch)  # type: ignore[call-arg]  # attrs alias


def _is_integer(_checker: object, value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_Strict2020: type[Validator] = extend(  # type: ignore[no-untyped-call]  # untyped in types-jsonschema
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)
"""Draft 2020-12 with ``integer`` as the gateway always read it (``1.0`` is a number only)."""


def check_schema(value: Any, schema: Any, root: dict[str, Any] | None = None) -> None:
    """Raise SchemaMismatch unless ``value`` satisfies ``schema``.

    ``root`` is the document that local ``$ref`` pointers resolve in (default:
    ``schema`` itself), for checking against a part of a larger schema.
    """
    document = schema if root is None else root
    try:
        names = _vetted(document, for_plan=False)
        if root is not None:
            names |= _vetted(schema, for_plan=False)
    except SchemaMismatch as err:
        raise SchemaMismatch(f"schema cannot be applied: {err}") from None
    _within_depth(value)
    try:
        validator = _Strict2020(document, registry=_NO_RETRIEVAL)
        if root is not None:
            validator = validator.evolve(schema=schema)
        error = next(iter(validator.iter_errors(value)), None)
    # Whatever stops the validator (a keyword of the wrong shape, an unknown
    # type, a $ref loop, a pointer to nowhere) is a failed check: fail closed.
    except Exception as err:
        raise SchemaMismatch(f"schema cannot be applied: {type(err).__name__}") from None
    if error is not None:
        raise SchemaMismatch(_message(error, names))


def matches(value: Any, schema: Any, root: dict[str, Any] | None = None) -> bool:
    """True if ``value`` satisfies ``schema`` (``$ref`` pointers resolved in ``root``)."""
    try:
        check_schema(value, schema, root)
    except SchemaMismatch:
        return False
    return True


def check_well_formed(schema: Any) -> None:
    """Raise SchemaMismatch naming the keyword if ``schema`` is not one the checks can apply.

    For schemas written in plans (``expect.schema``): a mistake there must be found
    before the step runs, not after (a write would already have happened).
    Besides the bounds and the keywords refused in every schema, the schema must
    be valid against the Draft 2020-12 meta-schema (patterns compile), every
    ``$ref`` must resolve inside it, and neither ``patternProperties`` nor
    ``prefixItems`` may sit beside the keyword it narrows.
    """
    if not isinstance(schema, dict):
        raise SchemaMismatch("$: a schema must be an object")
    _vetted(schema, for_plan=True)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        keyword = next((p for p in reversed(err.absolute_path) if isinstance(p, str)), "")
        phrase = _WELL_FORMED_PHRASES.get(keyword, f"not a valid {keyword or 'schema'}")
        raise SchemaMismatch(f"{err.json_path}: {phrase}") from None
    resolver = _NO_RETRIEVAL.resolver_with_root(DRAFT202012.create_resource(schema))
    for path, ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Exception:
            raise SchemaMismatch(f"{path}.$ref: not a reference into this schema") from None


def _vetted(schema: Any, *, for_plan: bool) -> set[str]:
    """Check a schema's shape bounds and refused keywords; returns its declared property names."""
    names: set[str] = set()
    count = 0
    pending: list[tuple[Any, str, int]] = [(schema, "$", 0)]
    while pending:
        node, path, depth = pending.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_SUBSCHEMAS:
            raise SchemaMismatch(f"{path}: schema nests too deeply or is too large")
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise SchemaMismatch(f"{path}: a schema must be an object or a boolean")
        for keyword in _REFUSED_KEYWORDS:
            if keyword in node:
                raise SchemaMismatch(f"{path}.{keyword}: not supported")
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise SchemaMismatch(f"{path}.$ref: not a reference into this schema")
        if for_plan:
            for widening, narrowed in _WIDENING.items():
                if widening in node and narrowed in node:
                    raise SchemaMismatch(f"{path}.{widening}: not supported beside {narrowed}")
        properties = node.get("properties")
        if isinstance(properties, dict):
            names.update(name for name in properties if isinstance(name, str))
        pending.extend(_subschemas(node, path, depth + 1))
    return names


def _subschemas(node: dict[str, Any], path: str, depth: int) -> Iterator[tuple[Any, str, int]]:
    for keyword in _SCHEMA_VALUED:
        if keyword in node:
            yield node[keyword], f"{path}.{keyword}", depth
    for keyword in _SCHEMA_LISTS:
        subs = node.get(keyword)
        if isinstance(subs, list):
            yield from ((sub, f"{path}.{keyword}[{i}]", depth) for i, sub in enumerate(subs))
    for keyword in _SCHEMA_MAPS:
        subs = node.get(keyword)
        if isinstance(subs, dict):
            yield from ((sub, f"{path}.{keyword}.{name}", depth) for name, sub in subs.items())


def _refs(schema: dict[str, Any]) -> Iterator[tuple[str, str]]:
    pending: list[tuple[Any, str]] = [(schema, "$")]
    while pending:
        node, path = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield path, node["$ref"]
            pending.extend((sub, sub_path) for sub, sub_path, _ in _subschemas(node, path, 0))


def _within_depth(value: Any) -> None:
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                raise SchemaMismatch(f"$: nests deeper than {MAX_DEPTH} levels")
            items = node.values() if isinstance(node, dict) else node
            pending.extend((item, depth + 1) for item in items)


def _message(error: ValidationError, names: set[str]) -> str:
    path = "$"
    for part in error.absolute_path:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if part in names else ".*"
    keyword = error.validator
    if not isinstance(keyword, str):
        return f"{path}: not allowed"  # a ``false`` schema
    wanted = error.validator_value
    if keyword == "required" and isinstance(wanted, list) and isinstance(error.instance, dict):
        missing = next((n for n in wanted if isinstance(n, str) and n not in error.instance), None)
        if missing is not None:
            return f"{path}: violates required ({missing[:64]!r} is missing)"
    return f"{path}: violates {keyword}"
