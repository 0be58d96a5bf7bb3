"""The part of a step's input a route's contract declares, at every depth.

What leaves the agent is the route's input schema applied to the resolved
input: top-level fields the contract declares (``Offer.input_fields``), and
inside each of them only what its schema declares, recursively:

* an object whose schema lists ``properties`` keeps those fields (a field whose
  schema is ``false`` is dropped), plus the others only when
  ``additionalProperties`` is a schema (a map such as ``dict[str, Item]``),
  each minimised by it;
* an object schema without ``properties`` is a map: ``additionalProperties``
  ``false`` keeps nothing, a schema minimises every value, else it is free-form;
* arrays minimise their items by ``prefixItems`` and ``items``;
* ``$ref`` (local, into the same document) and ``allOf`` apply in turn; for
  ``anyOf``/``oneOf`` the first branch the minimised value satisfies is taken
  (none: the first branch's minimisation, which the peer will refuse);
* anything else (strings, numbers, free-form schemas) passes unchanged.

A schema that cannot be followed (a non-local ``$ref``, one nested deeper
than ``MAX_DEPTH``, ``$ref`` loops included) sends nothing: ``InvalidInput``.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidInput
from gateway.plans.document.schema import matches

MAX_DEPTH = 192
"""Most schema levels followed (``$ref`` hops included) before giving up: about 60
levels of a recursive model (property, items, ``$ref``), deeper than any plan input
pydantic reads (its JSON parser stops at 200 levels of the value)."""


def declared_part(value: Any, schema: Any, root: dict[str, Any]) -> Any:
    """``value`` with everything ``schema`` (``$ref`` pointers into ``root``) does not declare
    removed.

    Raises:
        InvalidInput: the schema cannot be followed (nothing may be sent).
    """
    try:
        return _prune(value, schema, root, 0)
    except RecursionError as err:  # an output deep enough to exhaust the stack first
        raise InvalidInput("the input nests too deeply to minimise") from err


def _prune(value: Any, schema: Any, root: dict[str, Any], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise InvalidInput("the contract's input schema nests too deeply to minimise the input")
    if not isinstance(schema, dict):
        return value  # true (anything) or false (the peer refuses whatever is sent)
    if "$ref" in schema:
        value = _prune(value, _resolve(schema["$ref"], root), root, depth + 1)
    every = schema.get("allOf")
    for sub in every if isinstance(every, list) else ():
        value = _prune(value, sub, root, depth + 1)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches:
        value = _branch(value, branches, root, depth)
    if isinstance(value, dict):
        return _object(value, schema, root, depth)
    if isinstance(value, list):
        return _array(value, schema, root, depth)
    return value


def _branch(value: Any, branches: Any, root: dict[str, Any], depth: int) -> Any:
    candidates = [_prune(value, branch, root, depth + 1) for branch in branches]
    for branch, candidate in zip(branches, candidates, strict=True):
        if matches(candidate, branch, root):
            return candidate
    return candidates[0]


def _object(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], depth: int) -> Any:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if not isinstance(properties, dict):
        if extra is False:
            return {}
        if isinstance(extra, dict):
            return {key: _prune(item, extra, root, depth + 1) for key, item in value.items()}
        return value  # a free-form object
    kept: dict[str, Any] = {}
    for key, item in value.items():
        if key in properties:
            if properties[key] is not False:
                kept[key] = _prune(item, properties[key], root, depth + 1)
        elif isinstance(extra, dict) and extra:
            kept[key] = _prune(item, extra, root, depth + 1)
    return kept


def _array(value: list[Any], schema: dict[str, Any], root: dict[str, Any], depth: int) -> Any:
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    items = schema.get("items", True)
    return [
        _prune(item, prefix[index] if index < len(prefix) else items, root, depth + 1)
        for index, item in enumerate(value)
    ]


def _resolve(ref: Any, root: dict[str, Any]) -> Any:
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise InvalidInput("the contract's input schema refers outside itself")
    node: Any = root
    for part in ref[2:].split("/") if ref != "#" else ():
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or key not in node:
            raise InvalidInput("the contract's input schema refers to a part it does not have")
        node = node[key]
    return node
