"""On whose behalf a call runs: the user a verified token names, and the agents between.

A call may carry a user token (``docs/identity.md``): an OAuth token for a
person, from a trusted issuer, whose actor (``act.sub``, else ``azp``) is the
calling agent. The gateway verifies it (``gateway.identity``) and hands the
policy only what it proved: the user's subject, its issuer, its claims and the
actor chain. The token itself never gets this far.

Grants test users with ``users = "required"``, ``user_claims`` and conditions
(``policies.conditions``); :func:`claims_match` is the ``user_claims`` test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

ClaimValue = str | int | bool
"""A value ``user_claims`` may require: a string, a whole number, or a boolean."""


@dataclass(frozen=True, slots=True)
class OnBehalfOf:
    """The user a call acts for, as proven by a verified user token.

    Attributes:
        subject: The user's ``sub`` (what the audit record's ``on_behalf_of`` holds).
        issuer: The issuer that vouched for the user (its ``iss``).
        claims: The token's claims (registered ones included), read-only; the
            token itself is never kept.
        actors: The actor chain, nearest first: the calling agent's SPIFFE ID,
            then every agent before it (the token's nested ``act``).
    """

    subject: str
    issuer: str
    claims: Mapping[str, Any]
    actors: tuple[str, ...]

    @classmethod
    def of(
        cls, subject: str, issuer: str, claims: Mapping[str, Any], actors: tuple[str, ...]
    ) -> OnBehalfOf:
        """A user with a read-only copy of ``claims``."""
        return cls(subject, issuer, MappingProxyType(dict(claims)), actors)

    def __repr__(self) -> str:
        # Subject and actors only: claims can hold personal data.
        return (
            f"OnBehalfOf(subject={self.subject!r}, issuer={self.issuer!r}, actors={self.actors!r})"
        )


def claims_match(claims: Mapping[str, Any], required: Mapping[str, ClaimValue]) -> str | None:
    """The first claim of ``required`` that ``claims`` does not satisfy, or None.

    A claim is satisfied when it equals the required value, or, for a list
    claim (``groups``, ``roles``) or the space-separated ``scope`` claim of
    OAuth (RFC 8693 4.2), when it contains it. A boolean never equals a number.
    """
    for name, wanted in required.items():
        value = claims.get(name)
        if name == "scope" and isinstance(value, str):
            value = value.split()
        if isinstance(value, list | tuple):
            if not any(_same(item, wanted) for item in value):
                return name
        elif not _same(value, wanted):
            return name
    return None


def _same(value: object, wanted: ClaimValue) -> bool:
    return type(value) is type(wanted) and value == wanted
