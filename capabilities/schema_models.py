"""Contract models built from JSON Schema, for capabilities declared in configuration.

A capability written in Python states its contract with pydantic models. One
declared in a config file (an A2A upstream's skill, for example) states it as a
JSON Schema instead; ``contract_model`` turns that schema into a model with the
same guarantees: unknown fields refused, strict types, frozen.

Only a small, closed subset of JSON Schema is understood, and anything outside
it is refused rather than ignored, so a constraint written in the file is never
silently dropped::

    type: object (top level, and nested), string, integer, number, boolean, array
    properties, required, additionalProperties (false only: it is always false)
    items (arrays), enum (strings), minLength, maxLength, minimum, maximum,
    minItems, maxItems, title, description
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, create_model, model_serializer

from capabilities.contract import ContractModel

_MAX_DEPTH = 8
_SCALARS: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}
_COMMON = frozenset({"type", "title", "description"})
_ALLOWED: dict[str, frozenset[str]] = {
    "object": _COMMON | {"properties", "required", "additionalProperties"},
    "array": _COMMON | {"items", "minItems", "maxItems"},
    "string": _COMMON | {"enum", "minLength", "maxLength"},
    "integer": _COMMON | {"minimum", "maximum"},
    "number": _COMMON | {"minimum", "maximum"},
    "boolean": _COMMON,
}
_FIELD_CONSTRAINTS = {
    "minLength": "min_length",
    "maxLength": "max_length",
    "minimum": "ge",
    "maximum": "le",
    "minItems": "min_length",
    "maxItems": "max_length",
}


class SchemaContractModel(ContractModel):
    """Base of the models built here: an optional field that was absent stays absent.

    A schema property that is not ``required`` may be missing, but not null;
    dumping it as null would break the very schema the model was built from.
    """

    @model_serializer(mode="wrap")
    def _only_present_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):  # an absent optional object (None): its parent drops it
            return data
        return {key: value for key, value in data.items() if key in self.model_fields_set}


class SchemaNotSupported(ValueError):
    """The schema uses a form outside the supported subset (the message names where)."""


def contract_model(name: str, schema: dict[str, Any]) -> type[ContractModel]:
    """A strict, frozen pydantic model accepting exactly the objects ``schema`` describes.

    Args:
        name: Model (class) name, e.g. ``LegacyEchoInput``.
        schema: A JSON Schema of ``type: object`` within the supported subset.

    Raises:
        SchemaNotSupported: the schema is not an object schema of the subset.
    """
    if schema.get("type") != "object":
        raise SchemaNotSupported("the top level must be {'type': 'object', ...}")
    return _object_model(name, schema, "", 0)


def _object_model(name: str, schema: dict[str, Any], where: str, depth: int) -> type[ContractModel]:
    _check_keywords(schema, "object", where)
    if depth > _MAX_DEPTH:
        raise SchemaNotSupported(f"{where or '(top level)'}: nested more than {_MAX_DEPTH} deep")
    if schema.get("additionalProperties", False) is not False:
        raise SchemaNotSupported(f"{_at(where)}additionalProperties: only false is supported")
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not all(isinstance(k, str) for k in properties):
        raise SchemaNotSupported(f"{_at(where)}properties: must be a table of schemas")
    if not isinstance(required, list) or not set(required) <= set(properties):
        raise SchemaNotSupported(f"{_at(where)}required: must list declared properties")
    fields: dict[str, Any] = {}
    for key, sub in properties.items():
        if not key.isidentifier() or key.startswith("_"):
            raise SchemaNotSupported(f"{_at(where)}properties.{key}: not a usable field name")
        path = f"{where}.{key}" if where else key
        annotation, constraints = _annotation(f"{name}_{key}", sub, path, depth + 1)
        # Optional means "may be absent", not "may be null": the default is
        # never validated, and an explicit null still fails the strict type.
        default = ... if key in required else None
        fields[key] = (annotation, Field(default, **constraints))
    model: type[ContractModel] = create_model(name, __base__=SchemaContractModel, **fields)
    return model


def _annotation(name: str, schema: Any, where: str, depth: int) -> tuple[Any, dict[str, Any]]:
    if not isinstance(schema, dict):
        raise SchemaNotSupported(f"{where}: must be a schema table")
    kind = schema.get("type")
    if kind == "object":
        return _object_model(name, schema, where, depth), {}
    if kind not in _ALLOWED:
        raise SchemaNotSupported(f"{where}.type: {kind!r} is not one of {sorted(_ALLOWED)}")
    _check_keywords(schema, kind, where)
    constraints: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in _FIELD_CONSTRAINTS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SchemaNotSupported(f"{where}.{keyword}: must be a number")
            constraints[_FIELD_CONSTRAINTS[keyword]] = value
    if kind == "array":
        if "items" not in schema:
            raise SchemaNotSupported(f"{where}.items: an array must say what it holds")
        item, item_constraints = _annotation(name, schema["items"], f"{where}.items", depth + 1)
        if item_constraints:
            item = _constrained(item, item_constraints)
        return tuple[item, ...], constraints  # type: ignore[valid-type]
    if "enum" in schema:
        values = schema["enum"]
        if not values or not all(isinstance(v, str) for v in values):
            raise SchemaNotSupported(f"{where}.enum: must be a non-empty list of strings")
        return Literal[tuple(values)], constraints
    return _SCALARS[kind], constraints


def _constrained(annotation: Any, constraints: dict[str, Any]) -> Any:
    return Annotated[annotation, Field(**constraints)]


def _check_keywords(schema: dict[str, Any], kind: str, where: str) -> None:
    unknown = sorted(set(schema) - _ALLOWED[kind])
    if unknown:
        raise SchemaNotSupported(f"{_at(where)}{unknown[0]}: not supported for type {kind}")


def _at(where: str) -> str:
    return f"{where}." if where else ""
