"""The name of a question's schema, so another process of the agent can admit its answer.

A task waiting in ``ctx.ask_input(prompt, schema=Model)`` keeps ``Model``'s
``module:qualname`` on its row. A process that does not run the task but
receives the answer validates it against the class of that name, found only
among the modules it has already loaded (its capability modules: the same
deployment), never imported on the strength of a row. A model that no module
names (a class made inside a function) is ``?``: its answers are taken only by
the process running the task.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

UNNAMED = "?"
"""A schema no other process can find by name."""


def name_of(schema: type[BaseModel] | None) -> str:
    """``module:qualname`` of ``schema`` if that names it ("" for none, ``?`` if it does not)."""
    if schema is None:
        return ""
    name = f"{schema.__module__}:{schema.__qualname__}"
    return name if model_named(name) is schema else UNNAMED


def model_named(name: str) -> type[BaseModel] | None:
    """The model class ``name`` (``module:qualname``) names among loaded modules, if any."""
    module_name, _, qualname = name.partition(":")
    found: object = sys.modules.get(module_name)
    for attribute in qualname.split(".") if found is not None and qualname else ():
        if attribute.startswith("<"):  # <locals>: nothing outside the function names it
            return None
        found = getattr(found, attribute, None)
    if isinstance(found, type) and issubclass(found, BaseModel):
        return found
    return None
