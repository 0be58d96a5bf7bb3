"""Semantic versions and the constraints that select among them.

Accepted constraint forms (comma-separated clauses are ANDed):

* ``""`` or ``"*"``: any version
* ``"1"`` / ``"1.2"``: any version with that prefix (``1.x.x`` / ``1.2.x``)
* ``"1.2.3"`` or ``"=1.2.3"``: exactly that version
* ``"^1.2"``: compatible with 1.2 (``>=1.2.0,<2.0.0``; for 0.x, ``<0.(x+1).0``)
* ``"~1.2"``: ``>=1.2.0,<1.3.0``
* ``">=1.0,<2"`` and friends (``>``, ``>=``, ``<``, ``<=``, ``=``, ``==``)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

from pydantic import AfterValidator

_VERSION = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})")
_PARTIAL = re.compile(r"(0|[1-9][0-9]{0,8})(?:\.(0|[1-9][0-9]{0,8}))?(?:\.(0|[1-9][0-9]{0,8}))?")
_CLAUSE = re.compile(r"(\^|~|>=|<=|==|=|>|<)?\s*(\S+)")
_MAX_CONSTRAINT_LENGTH = 128


class VersionSyntaxError(ValueError):
    """A version or constraint string is malformed."""


@dataclass(frozen=True, order=True, slots=True)
class Version:
    """A ``MAJOR.MINOR.PATCH`` semantic version (no pre-release tags)."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> Version:
        """Parse ``MAJOR.MINOR.PATCH``; raises VersionSyntaxError."""
        match = _VERSION.fullmatch(text)
        if match is None:
            raise VersionSyntaxError(f"not a MAJOR.MINOR.PATCH version: {text!r}")
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


_Predicate = Callable[[Version], bool]


def _partial(text: str) -> tuple[int, ...]:
    match = _PARTIAL.fullmatch(text)
    if match is None:
        raise VersionSyntaxError(f"not a version: {text!r}")
    return tuple(int(part) for part in match.groups() if part is not None)


def _padded(parts: tuple[int, ...]) -> Version:
    major, minor, patch = (*parts, 0, 0)[:3]
    return Version(major, minor, patch)


def _prefix_bounds(parts: tuple[int, ...]) -> tuple[Version, Version]:
    low = _padded(parts)
    if len(parts) == 1:
        return low, Version(parts[0] + 1, 0, 0)
    if len(parts) == 2:
        return low, Version(parts[0], parts[1] + 1, 0)
    return low, Version(low.major, low.minor, low.patch + 1)


def _caret_upper(parts: tuple[int, ...]) -> Version:
    low = _padded(parts)
    if low.major > 0 or len(parts) == 1:
        return Version(low.major + 1, 0, 0)
    if low.minor > 0 or len(parts) == 2:
        return Version(0, low.minor + 1, 0)
    return Version(0, 0, low.patch + 1)


def _clause(text: str) -> _Predicate:
    match = _CLAUSE.fullmatch(text.strip())
    if match is None:
        raise VersionSyntaxError(f"bad constraint clause: {text!r}")
    operator, operand = match.group(1) or "", match.group(2)
    try:
        parts = _partial(operand)
    except VersionSyntaxError as err:  # name what was written, not the part left after ">"
        raise VersionSyntaxError(f"not a version constraint: {text.strip()!r}") from err
    if operator in ("", "=", "=="):
        low, high = _prefix_bounds(parts)
        return lambda v: low <= v < high
    if operator == "^":
        low, high = _padded(parts), _caret_upper(parts)
        return lambda v: low <= v < high
    if operator == "~":
        low = _padded(parts)
        high = (
            Version(low.major + 1, 0, 0)
            if len(parts) == 1
            else Version(low.major, low.minor + 1, 0)
        )
        return lambda v: low <= v < high
    bound = _padded(parts)
    comparisons: dict[str, _Predicate] = {
        ">": lambda v: v > bound,
        ">=": lambda v: v >= bound,
        "<": lambda v: v < bound,
        "<=": lambda v: v <= bound,
    }
    return comparisons[operator]


@dataclass(frozen=True, slots=True)
class VersionConstraint:
    """A parsed constraint; ``allows(version)`` tells whether it matches."""

    text: str
    _clauses: tuple[_Predicate, ...]

    @classmethod
    def parse(cls, text: str) -> VersionConstraint:
        """Parse a constraint (see module docstring); raises VersionSyntaxError."""
        return _parse_cached(text)

    def allows(self, version: Version) -> bool:
        """True if every clause admits ``version``."""
        return all(clause(version) for clause in self._clauses)

    def highest(self, versions: Iterable[Version]) -> Version | None:
        """The highest of ``versions`` this constraint admits, if any."""
        best: Version | None = None
        for version in versions:
            if self.allows(version) and (best is None or version > best):
                best = version
        return best

    def __str__(self) -> str:
        return self.text or "*"


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> VersionConstraint:
    if len(text) > _MAX_CONSTRAINT_LENGTH:
        raise VersionSyntaxError("constraint is too long")
    stripped = text.strip()
    if stripped in ("", "*"):
        return VersionConstraint(text, ())
    clauses = tuple(_clause(part) for part in stripped.split(","))
    return VersionConstraint(text, clauses)


def _checked_constraint(value: str) -> str:
    try:
        VersionConstraint.parse(value)
    except VersionSyntaxError as err:
        raise ValueError(str(err)) from err
    return value


ConstraintText = Annotated[str, AfterValidator(_checked_constraint)]
"""A pydantic field type: constraint text that ``VersionConstraint.parse`` accepts."""
