"""Dotted JSON paths into step outputs: ``items.0.title`` (list items by index).

One reader for every place a plan names part of an output: ``$from`` references
(``STEP.path``), ``verify.compare`` and the ``expect.equals`` / ``expect.range`` checks.
"""

from __future__ import annotations

from typing import Any

PATH_PATTERN = r"^[^.\s]+(\.[^.\s]+)*$"
"""A path: one or more non-empty segments separated by dots."""


def read_path(value: Any, path: str) -> Any:
    """The part of ``value`` at ``path``.

    Raises:
        KeyError: ``path`` does not exist in ``value`` (the key is the path).
    """
    current = value
    for part in path.split("."):
        if isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        elif isinstance(current, dict) and part in current:
            current = current[part]
        else:
            raise KeyError(path)
    return current


def has_path(value: Any, path: str) -> bool:
    """True if ``path`` exists in ``value``."""
    try:
        read_path(value, path)
    except KeyError:
        return False
    return True
