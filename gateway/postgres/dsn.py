"""Where state lives: a SQLite path or a PostgreSQL DSN, told apart by the scheme.

DSNs end up in error messages and logs; their credentials must not. Every
form libpq accepts is redacted: the URL's userinfo password
(``postgresql://u:SECRET@host``), query parameters (``?password=SECRET``,
``sslpassword``) and keyword/value conninfo (``password=SECRET``,
``password='SE CRET'``). :func:`redact_credentials` does that for any text;
:meth:`PostgresDsn.scrub` also removes the DSN's own secrets wherever a
driver message repeats them (libpq quotes a malformed token verbatim:
``invalid percent-encoded token: "pw%zz"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BeforeValidator

_SCHEMES = ("postgresql://", "postgres://")
REDACTED = "***"
"""What a secret is replaced with."""
_SHORT = 4

_SECRET_KEYS = r"(?:pg)?(?:ssl)?pass(?:word)?"
# scheme://user:SECRET@host: the userinfo runs to the last '@' of the token.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:@/?#]*:)\S*@")
# ?password=SECRET&... (one parameter; the next one is kept).
_QUERY = re.compile(rf"(?i)([?&]{_SECRET_KEYS}=)[^&\s#]*")
# password=SECRET, password = 'SE CRET' (keyword/value conninfo, environment).
_KEYWORD = re.compile(rf"(?i)(?<![?&\w])({_SECRET_KEYS}\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]*)")
# The same two forms in one whole URL, where whitespace is part of the value (libpq
# takes ``u:sec ret@host``), not the end of a token as in free text.
_URL_USERINFO = re.compile(r"(?is)^([a-z][a-z0-9+.-]*://[^:@/?#]*:).*@")
_URL_QUERY = re.compile(rf"(?i)([?&]{_SECRET_KEYS}=)[^&#]*")


def redact_credentials(text: str) -> str:
    """``text`` with every credential form of a DSN replaced by ``***``."""
    text = _USERINFO.sub(rf"\g<1>{REDACTED}@", text)
    text = _QUERY.sub(rf"\g<1>{REDACTED}", text)
    return _KEYWORD.sub(rf"\g<1>{REDACTED}", text)


def is_dsn(text: str) -> bool:
    """True if ``text`` is a PostgreSQL URL (``postgresql://`` or ``postgres://``)."""
    return text.strip().lower().startswith(_SCHEMES)


@dataclass(frozen=True, slots=True)
class PostgresDsn:
    """A PostgreSQL connection URL.

    ``str()`` gives the URL with every credential replaced by ``***`` (see
    the module doc).

    Attributes:
        url: The URL as configured (passed to the driver only).
    """

    url: str

    @property
    def redacted(self) -> str:
        """The URL without its credentials (a password holding whitespace too)."""
        url = _URL_USERINFO.sub(rf"\g<1>{REDACTED}@", self.url)
        return redact_credentials(_URL_QUERY.sub(rf"\g<1>{REDACTED}", url))

    def scrub(self, text: str) -> str:
        """``text`` (e.g. a driver's message) without this DSN's secrets in any form."""
        for secret in sorted(self._secrets(), key=len, reverse=True):
            if len(secret) >= _SHORT:
                text = text.replace(secret, REDACTED)
            else:  # a short one only as a whole token, not inside every word
                token = rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])"
                text = re.sub(token, REDACTED, text)
        return redact_credentials(text)

    def why(self, err: BaseException) -> str:
        """The first line of a driver error about this DSN, scrubbed of its secrets."""
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return self.scrub(first)

    def _secrets(self) -> set[str]:
        try:
            parts = urlsplit(self.url)
        except ValueError:
            parts = None
        found: set[str] = set()
        netloc = parts.netloc if parts else self.url
        userinfo = netloc.rpartition("@")[0]
        if ":" in userinfo:
            password = userinfo.partition(":")[2]
            # libpq ends the userinfo at the first '@', so an '@' in the
            # password leaks its pieces into the host it then reports.
            found.update([password, *password.split("@")])
        query = parts.query if parts else ""
        for key, value in parse_qsl(query, keep_blank_values=True):
            if re.fullmatch(_SECRET_KEYS, key, re.IGNORECASE):
                found.add(value)
        for match in _QUERY.finditer(self.url):
            end = match.end()
            found.add(self.url[match.end(1) : end])
        found |= {unquote(secret) for secret in found}
        return {secret for secret in found if secret}

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
"""A config value naming a store: a SQLite path or a PostgreSQL DSN."""


def local_file(where: Path | PostgresDsn) -> Path | None:
    """The SQLite file a store location names, or None for a PostgreSQL database."""
    return None if isinstance(where, PostgresDsn) else where
