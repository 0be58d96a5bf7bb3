"""A validation problem of a TOML file, said in the file's words rather than pydantic's.

``lisen: unknown key (did you mean listen?)`` instead of ``Extra inputs are not
permitted``; ``tls.expiry_warning`` instead of ``tls.files.expiry_warning`` (the
tag of the ``[tls]`` variant is pydantic's, not a key of the file); ``expected a
whole number`` instead of ``Input should be a valid integer, unable to parse
string as an integer``. Our own validators' messages are kept, without
pydantic's ``Value error,`` in front. A problem says what was wrong and where,
never the value: a config value may be a DSN with a password.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

_EXPECTED = {
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "string_type": "expected a string (in quotes)",
    "list_type": "expected a list ([...])",
    "tuple_type": "expected a list ([...])",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "datetime_type": "expected a date and time, e.g. 2030-01-01T00:00:00Z",
    "datetime_parsing": "expected a date and time, e.g. 2030-01-01T00:00:00Z",
    "datetime_from_date_parsing": "expected a date and time, e.g. 2030-01-01T00:00:00Z",
    "missing": "missing: this key is required here",
}
_BOUNDS = {
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "too_short": "needs at least {min_length} item(s)",
    "too_long": "takes at most {max_length} item(s)",
    "string_too_short": "needs at least {min_length} character(s)",
    "string_too_long": "takes at most {max_length} character(s)",
}


def toml_path(problem: ErrorDetails, model: type[BaseModel] | None) -> list[str | int]:
    """The problem's location as keys of the file: union tags and variant names dropped."""
    if model is None:
        return list(problem["loc"])
    path: list[str | int] = []
    here: list[type[BaseModel]] = [model]
    for item in problem["loc"]:
        if isinstance(item, int):
            path.append(item)
            continue
        fields = [m.model_fields[item] for m in here if item in m.model_fields]
        variants = [m for m in here if _names_variant(m, item)] if len(here) > 1 else []
        if fields:
            path.append(item)
            here = [m for field in fields for m in _models_in(field.annotation)]
        elif variants:  # a variant's tag or class name: pydantic's word, not the file's
            here = variants
        else:  # a key the file has and the model does not
            path.append(item)
            here = []
    return path


def toml_message(
    problem: ErrorDetails, model: type[BaseModel] | None, path: list[str | int]
) -> str:
    """What is wrong, in the words of the file (``path`` as :func:`toml_path` gave it)."""
    kind, ctx = problem["type"], problem.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key(str(path[-1]) if path else "", _known_keys(model, path[:-1]))
    if kind == "value_error":
        return str(ctx.get("error", problem["msg"].removeprefix("Value error, ")))
    if kind == "union_tag_invalid":
        tags = str(ctx.get("expected_tags", ""))
        return f"source must be one of {tags}"
    if kind in _BOUNDS:
        return _BOUNDS[kind].format(**ctx)
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    return problem["msg"].replace("Input should be ", "expected ", 1)


def _unknown_key(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]}?)"
    if known and len(known) <= 12:
        return f"unknown key (the keys here: {', '.join(sorted(known))})"
    return "unknown key"


def _known_keys(model: type[BaseModel] | None, parent: list[str | int]) -> list[str]:
    if model is None:
        return []
    here: list[type[BaseModel]] = [model]
    for item in parent:
        if isinstance(item, int):
            continue
        here = [
            m
            for candidate in here
            if item in candidate.model_fields
            for m in _models_in(candidate.model_fields[item].annotation)
        ]
    return sorted({name for m in here for name in m.model_fields})


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (in lists, unions, Annotated, ``| None``)."""
    return list(dict.fromkeys(_walk(annotation)))


def _walk(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if typing.get_origin(annotation) is typing.Annotated:
        yield from _walk(typing.get_args(annotation)[0])
        return
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return
    for argument in typing.get_args(annotation):
        yield from _walk(argument)


def _names_variant(model: type[BaseModel], name: str) -> bool:
    """True if ``name`` is ``model``'s class name or the value of one of its literal fields."""
    if model.__name__ == name:
        return True
    return any(
        typing.get_origin(field.annotation) is typing.Literal
        and name in typing.get_args(field.annotation)
        for field in model.model_fields.values()
    )
