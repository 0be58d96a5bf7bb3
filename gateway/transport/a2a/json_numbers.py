"""Whole numbers back to integers where a capability's input schema says ``integer``.

``google.protobuf.Value`` carries every JSON number as a double, so an A2A
``data`` part turns ``{"limit": 2}`` into ``{"limit": 2.0}``, which a strict
contract refuses for an ``int`` field. Walking the contract's JSON Schema
alongside the value restores the integers the caller meant, and nothing else.
A schema is a set of alternatives (``$ref``, ``anyOf``, ``oneOf``, ``allOf``
expanded); a value is made an integer if any alternative allows ``integer``
(a strict ``float`` field accepts an integer too, so this never breaks a match).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]
Located = tuple[Schema, Schema]
"""(schema node, ``$defs`` of the document it belongs to)."""

_MAX_DEPTH = 64


@lru_cache(maxsize=256)
def _schema_of(model: type[BaseModel]) -> Schema:
    # model_json_schema is slow; contracts do not change while an agent runs.
    return model.model_json_schema()


def restore_integers(value: Any, models: Iterable[type[BaseModel]]) -> Any:
    """``value`` with whole floats made ints wherever one of ``models`` says integer."""
    roots = [(schema, schema.get("$defs", {})) for schema in map(_schema_of, models)]
    return _walk(value, roots, 0) if roots else value


def _walk(value: Any, schemas: list[Located], depth: int) -> Any:
    if depth > _MAX_DEPTH or not schemas:
        return value
    leaves = list(_alternatives(schemas))
    if isinstance(value, float):
        whole = value.is_integer() and abs(value) < 2**63
        return int(value) if whole and any(_allows_integer(s) for s, _ in leaves) else value
    if isinstance(value, dict):
        return {
            key: _walk(item, list(_property_schemas(leaves, key)), depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list):
        items = [(s["items"], defs) for s, defs in leaves if isinstance(s.get("items"), dict)]
        return [_walk(item, items, depth + 1) for item in value]
    return value


def _alternatives(schemas: list[Located]) -> Iterator[Located]:
    """Each schema with ``$ref`` resolved and ``anyOf``/``oneOf``/``allOf`` flattened."""
    pending = list(schemas)
    seen = 0
    while pending and seen < _MAX_DEPTH * 4:
        schema, defs = pending.pop()
        seen += 1
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = defs.get(ref.removeprefix("#/$defs/"))
            if isinstance(target, dict):
                pending.append((target, defs))
        for keyword in ("anyOf", "oneOf", "allOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list):
                pending.extend((b, defs) for b in branches if isinstance(b, dict))
        yield schema, defs


def _property_schemas(leaves: list[Located], key: str) -> Iterator[Located]:
    for schema, defs in leaves:
        properties = schema.get("properties")
        if isinstance(properties, dict) and isinstance(properties.get(key), dict):
            yield properties[key], defs
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            yield extra, defs


def _allows_integer(schema: Schema) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)
