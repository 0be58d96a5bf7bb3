"""Building blocks of every config table: the frozen model base and durations."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
)

_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])")


_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _duration(value: object) -> object:
    if isinstance(value, str) and value.startswith("P"):
        return value  # ISO 8601, as model_dump_json writes a timedelta: pydantic parses it
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{value!r}: expected a positive number and a unit s, m, h or d")
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    return value


Duration = Annotated[timedelta, BeforeValidator(_duration)]
"""A positive span written like ``"30s"``, ``"10m"``, ``"2h"`` or ``"7d"``."""


class FrozenTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
