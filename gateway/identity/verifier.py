"""Verifying one bearer token: issuer, key, algorithm, signature, claims; nothing else.

The order, each failure its own reason code (the token is never quoted)::

    size and shape        TOKEN_INVALID            at most max_token_bytes, compact JWS
    issuer                TOKEN_ISSUER_UNKNOWN     its iss (or a JWT-SVID's trust domain)
                                                   names a configured issuer
    header                TOKEN_INVALID            alg one the issuer accepts (never none
                                                   or HS*), a kid, no crit
    key                   TOKEN_INVALID            the issuer's key of that kid, of the
                                                   alg's type (an unknown kid refetches
                                                   the keys once, rate-limited)
    signature             TOKEN_SIGNATURE_INVALID
    expiry                TOKEN_EXPIRED            exp, with clock_skew
    audience              TOKEN_AUDIENCE_MISMATCH  aud names this agent's audience
    claims                TOKEN_INVALID            sub; nbf and iat not ahead; exp - iat
                                                   within max_lifetime
    single use            TOKEN_REPLAYED           issuers with single_use_jti: a jti,
                                                   never seen before

The issuer is chosen from the unverified claims, but only to pick which keys
may verify the token: nothing else of them is believed before the signature.

A verified token is cached (by its exact text) until it expires or its
issuer's keys change, so a caller reusing its token pays for the signature
once. Single-use tokens are never cached: each presentation is checked
against the spent ``jti`` set. That set lives in this process: an issuer with
``single_use_jti`` needs ``workers = 1`` (the config says so).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.exceptions import (
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAudienceError,
    InvalidIssuedAtError,
    InvalidIssuerError,
    InvalidSignatureError,
    InvalidTokenError,
    MissingRequiredClaimError,
)

from gateway.config.identity import TokenIssuer, TokenSettings, spiffe_trust_domain
from gateway.errors import (
    TokenAudienceMismatch,
    TokenExpired,
    TokenInvalid,
    TokenIssuerUnknown,
    TokenReplayed,
    TokenSignatureInvalid,
)
from gateway.identity.keys import IssuerKeys, alg_fits
from gateway.identity.spent_ids import SpentTokenIds

_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_MAX_CACHED = 4096
_MAX_KID = 256


class KeysMissing(Exception):
    """The token names a ``kid`` its issuer's set lacks, and the set may be fetched again."""

    def __init__(self, keys: IssuerKeys) -> None:
        super().__init__(keys.issuer.name)
        self.keys = keys


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A token whose signature and claims passed.

    Attributes:
        issuer: The configured issuer that signed it.
        claims: Its claims.
        expires_at: Its ``exp`` (epoch seconds).
    """

    issuer: TokenIssuer
    claims: Mapping[str, Any]
    expires_at: float


class TokenVerifier:
    """Verifies tokens for one agent against its ``[identity.tokens]``."""

    def __init__(self, settings: TokenSettings, agent_id: str, keys: list[IssuerKeys]) -> None:
        self.settings = settings
        self.audience = settings.audience_for(agent_id)
        self._skew = settings.clock_skew.total_seconds()
        self._lifetime = settings.max_lifetime.total_seconds()
        self._by_iss = {k.issuer.issuer: k for k in keys if k.issuer.issuer is not None}
        self._by_domain = {k.issuer.trust_domain: k for k in keys if k.issuer.kind == "jwt-svid"}
        self.keys = keys
        self._cache: dict[str, tuple[VerifiedToken, int]] = {}
        self._spent = SpentTokenIds()

    def verify(self, token: str, *, now: float | None = None) -> VerifiedToken:
        """The verified token, or the refusal that says why not (see module docstring).

        Raises:
            TokenInvalid: or one of its subclasses.
            KeysMissing: its ``kid`` is unknown and the keys may be fetched again
                (the caller awaits :meth:`IssuerKeys.refetch_for_unknown_kid` and
                calls again).
        """
        moment = time.time() if now is None else now
        cached = self._cache.get(token)
        if cached is not None:
            verified, generation = cached
            keys = self._keys_of(verified.issuer)
            if generation == keys.generation and moment <= verified.expires_at + self._skew:
                return verified
            del self._cache[token]
        verified, keys = self._verify(token, moment)
        if verified.issuer.single_use_jti:
            self._spend(verified, moment)
        else:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()  # bounded; the next calls verify once more
            self._cache[token] = (verified, keys.generation)
        return verified

    def _keys_of(self, issuer: TokenIssuer) -> IssuerKeys:
        for keys in self.keys:
            if keys.issuer is issuer:
                return keys
        raise AssertionError("an issuer without keys")  # built together in from_settings

    def _verify(self, token: str, now: float) -> tuple[VerifiedToken, IssuerKeys]:
        if len(token) > self.settings.max_token_bytes:
            raise TokenInvalid(
                f"the token is over {self.settings.max_token_bytes} bytes",
                detail=f"token of {len(token)} bytes",
            )
        if not _COMPACT_JWS.fullmatch(token):
            raise TokenInvalid("the token is not a signed JWT (compact JWS)")
        header, unverified = _unverified_parts(token)
        keys = self._issuer_keys(unverified)
        issuer = keys.issuer
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in issuer.algorithms:
            shown = alg if isinstance(alg, str) and len(alg) <= 16 else "?"
            raise TokenInvalid(
                f"alg {shown} is not accepted from issuer {issuer.name}",
                detail=f"{issuer.name}: alg {shown}",
            )
        if "crit" in header:
            raise TokenInvalid("the token's header has crit extensions this agent does not know")
        if not isinstance(kid, str) or not kid or len(kid) > _MAX_KID:
            raise TokenInvalid(f"the token names no usable kid (issuer {issuer.name})")
        key = keys.get(kid)
        if key is None:
            if keys.may_refetch():
                raise KeysMissing(keys)
            raise TokenInvalid(
                f"issuer {issuer.name} has no key with that kid",
                detail=f"{issuer.name}: unknown kid",
            )
        if not alg_fits(alg, key):
            raise TokenInvalid(
                f"the key of that kid does not sign {alg}", detail=f"{issuer.name}: alg/key"
            )
        claims = self._decoded(token, key, alg, issuer)
        exp = float(claims["exp"])
        self._check_lifetime(claims, exp, now, issuer)
        return VerifiedToken(issuer, claims, exp), keys

    def _issuer_keys(self, claims: Mapping[str, Any]) -> IssuerKeys:
        iss, sub = claims.get("iss"), claims.get("sub")
        if isinstance(iss, str) and iss in self._by_iss:
            return self._by_iss[iss]
        domain = spiffe_trust_domain(sub) if isinstance(sub, str) else None
        keys = self._by_domain.get(domain) if domain is not None else None
        if keys is not None and (iss is None or keys.issuer.issuer in (None, iss)):
            return keys
        raise TokenIssuerUnknown(
            "the token's issuer is not trusted here",
            detail=f"iss {_shown(iss)}, sub trust domain {_shown(domain)}",
        )

    def _decoded(self, token: str, key: Any, alg: str, issuer: TokenIssuer) -> dict[str, Any]:
        name = issuer.name
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                issuer=issuer.issuer,
                leeway=self._skew,
                options={"require": ["exp", "sub", "aud"], "verify_iat": True},
            )
        except InvalidSignatureError as err:
            raise TokenSignatureInvalid(
                f"the token's signature does not verify (issuer {name})", detail=name
            ) from err
        except ExpiredSignatureError as err:
            raise TokenExpired("the token has expired", detail=name) from err
        except InvalidAudienceError as err:
            raise TokenAudienceMismatch(
                f"the token is not for this agent (audience {self.audience})", detail=name
            ) from err
        except InvalidIssuerError as err:
            raise TokenIssuerUnknown(f"the token's iss is not {issuer.issuer}") from err
        except (ImmatureSignatureError, InvalidIssuedAtError) as err:
            raise TokenInvalid("the token is not valid yet (nbf or iat ahead)") from err
        except MissingRequiredClaimError as err:
            raise TokenInvalid(f"the token has no {err.claim} claim") from err
        except InvalidTokenError as err:
            raise TokenInvalid(
                "the token could not be read", detail=f"{name}: {type(err).__name__}"
            ) from err
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise TokenInvalid("the token's sub is not a string")
        return claims

    def _check_lifetime(
        self, claims: Mapping[str, Any], exp: float, now: float, issuer: TokenIssuer
    ) -> None:
        iat = claims.get("iat")
        start = float(iat) if isinstance(iat, int | float) and not isinstance(iat, bool) else now
        if exp - start > self._lifetime + self._skew:
            raise TokenInvalid(
                f"the token lives longer than {self._lifetime:g} s",
                detail=f"{issuer.name}: lifetime {exp - start:g} s",
            )

    def _spend(self, verified: VerifiedToken, now: float) -> None:
        jti = verified.claims.get("jti")
        if not isinstance(jti, str) or not jti or len(jti) > 256:
            raise TokenInvalid(
                f"issuer {verified.issuer.name} tokens are single-use: a jti is needed"
            )
        key = f"{verified.issuer.name}\x00{jti}"
        if not self._spent.first_use(key, verified.expires_at + self._skew, now):
            raise TokenReplayed(
                "this single-use token was already presented", detail=verified.issuer.name
            )


def _unverified_parts(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims, decoded but not believed (only to pick the issuer's keys)."""
    header_part, claims_part, _ = token.split(".")
    try:
        header = json.loads(_b64(header_part))
        claims = json.loads(_b64(claims_part))
    except (ValueError, binascii.Error, RecursionError) as err:
        raise TokenInvalid("the token is not a JWT (its parts are not base64url JSON)") from err
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise TokenInvalid("the token is not a JWT (header or claims not an object)")
    return header, claims


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _shown(value: object) -> str:
    """A claim as an audit detail shows it: a short string, escaped; else its type."""
    if isinstance(value, str):
        return json.dumps(value[:80], ensure_ascii=True)
    return "none" if value is None else type(value).__name__
