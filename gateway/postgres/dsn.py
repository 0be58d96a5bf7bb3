"""Where state lives: a SQLite path or a PostgreSQL DSN, told apart by the scheme."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import BeforeValidator

_SCHEMES = ("postgresql://", "postgres://")


def is_dsn(text: str) -> bool:
    """True if ``text`` is a PostgreSQL URL (``postgresql://`` or ``postgres://``)."""
    return text.strip().lower().startswith(_SCHEMES)


@dataclass(frozen=True, slots=True)
class PostgresDsn:
    """A PostgreSQL connection URL.

    ``str()`` gives the URL with any password replaced by ``***``: DSNs end
    up in error messages and logs, passwords must not.

    Attributes:
        url: The URL as configured (passed to the driver only).
    """

    url: str

    @property
    def redacted(self) -> str:
        """The URL without its password."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.rsplit("@", 1)
        user = (parts.username or "") + ":***"
        return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return f"PostgresDsn({self.redacted!r})"


def parse_location(value: object) -> object:
    """A DSN string becomes a PostgresDsn; anything else is left to the Path validator."""
    if isinstance(value, str) and is_dsn(value):
        return PostgresDsn(value.strip())
    return value


StoreLocation = Annotated[Path | PostgresDsn, BeforeValidator(parse_location)]
"""A config value naming a store: a SQLite file path or a PostgreSQL DSN."""
