"""Building blocks of every config table: the frozen model base, durations, expiry windows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
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


_SHARE = re.compile(r"([0-9]{1,2}(?:\.[0-9]{1,3})?)%")


@dataclass(frozen=True, slots=True)
class LifetimeShare:
    """A share of a certificate's lifetime, written ``"25%"``.

    Attributes:
        percent: More than 0, less than 100.
    """

    percent: float

    def of(self, not_before: datetime, not_after: datetime) -> timedelta:
        """This share of the lifetime from ``not_before`` to ``not_after``."""
        return (not_after - not_before) * (self.percent / 100)

    def __str__(self) -> str:
        return f"{self.percent:g}%"


def _share_or_duration(value: object) -> object:
    if isinstance(value, str) and "%" in value:
        match = _SHARE.fullmatch(value.strip())
        if match is None or not 0 < float(match.group(1)) < 100:
            raise ValueError(
                f"{value!r}: expected a share of the lifetime above 0% and below 100% (e.g. 25%)"
            )
        return LifetimeShare(float(match.group(1)))
    try:
        return _duration(value)
    except ValueError as err:
        raise ValueError(f"{err} (or a share of the lifetime, e.g. 25%)") from None


ExpiryWindow = Annotated[timedelta | LifetimeShare, BeforeValidator(_share_or_duration)]
"""How close to its expiry a certificate is warned about: a span (``"7d"``,
``"5m"``) or a share of the certificate's lifetime (``"25%"``)."""


def expiry_window(
    setting: timedelta | LifetimeShare, not_before: datetime, not_after: datetime
) -> timedelta:
    """The span before ``not_after`` in which ``setting`` warns of the expiry."""
    if isinstance(setting, LifetimeShare):
        return setting.of(not_before, not_after)
    return setting


class FrozenTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
