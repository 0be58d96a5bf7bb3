"""``[identity.tokens]``: bearer tokens this agent accepts, beside client certificates.

Off by default (no ``[identity.tokens]`` table): a caller is the SPIFFE ID of
its client certificate and nothing else, and any token is refused. Example::

    [identity.tokens]
    audience = "spiffe://example.org/agent/alice"   # default: the agent's id
    clock_skew = "30s"
    max_lifetime = "1h"
    token_only_callers = true    # HTTPS callers without a client certificate
    exchange_url = "https://idp.example.org/token"  # RFC 8693, for calls onward
    exchange_ca = "pki/idp-ca.pem"

    [[identity.tokens.issuers]]  # JWT-SVIDs of a trust domain
    name = "spire"
    kind = "jwt-svid"
    trust_domain = "example.org"
    jwks = "workload-api"        # the SPIFFE bundle from the Workload API

    [[identity.tokens.issuers]]  # an OIDC issuer: clients mapped to SPIFFE IDs, users
    name = "corp"
    kind = "oidc"
    issuer = "https://idp.example.org"
    jwks_url = "https://idp.example.org/jwks.json"
    ca = "pki/idp-ca.pem"        # the only CA trusted to serve that URL (pinned)
    users = true
    clients = { "billing" = "spiffe://example.org/agent/billing" }

See docs/identity.md. Every model is frozen and checked when the config loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from gateway.config.fields import Duration, FrozenTable
from policies.identity import SpiffeId, is_spiffe_id

SIGNING_ALGORITHMS = frozenset(
    {"ES256", "ES384", "ES512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "EdDSA"}
)
"""Asymmetric JWS algorithms an issuer may be configured for; ``none`` and the HMAC
ones (``HS256`` ...) never: a verifier holding only public keys must not accept a
token "signed" with one of them."""

_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]{1,255}")
IssuerName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]


def _https_url(value: str, key: str) -> str:
    if not re.fullmatch(r"https://[A-Za-z0-9.\-\[\]:]+(/[\x21-\x7e]*)?", value):
        raise ValueError(f"{key} {value!r}: expected an https:// URL")
    return value


class TokenIssuer(FrozenTable):
    """One issuer whose tokens this agent trusts (``[[identity.tokens.issuers]]``).

    Attributes:
        name: A short name for logs and audit details.
        kind: ``"jwt-svid"``: SPIFFE JWT-SVIDs of ``trust_domain``, the caller
            being the token's ``sub``. ``"oidc"``: tokens of an OpenID Connect
            issuer, a caller being a client named in ``clients``.
        trust_domain: The JWT-SVIDs' trust domain (``jwt-svid`` only).
        issuer: The ``iss`` the tokens carry (required for ``oidc``; for
            ``jwt-svid``, if set, the tokens must carry it).
        jwks: ``"workload-api"``: the trust domain's JWT bundle from the SPIFFE
            Workload API (``jwt-svid`` only; ``[tls] socket`` or
            ``$SPIFFE_ENDPOINT_SOCKET``).
        jwks_file: A JWKS (or SPIFFE bundle) file, re-read when it changes.
        jwks_url: An ``https://`` JWKS URL, fetched with ``ca`` pinned and cached.
        ca: The only CA trusted to serve ``jwks_url`` (PEM file).
        refresh: How often the keys are fetched again (an unknown ``kid``
            fetches them at once, at most every 30 s).
        algorithms: The JWS algorithms accepted (asymmetric only).
        single_use_jti: Every token must carry a ``jti`` and is accepted once
            (``TOKEN_REPLAYED`` after, until it expires); off: tokens are
            bearer tokens reused until they expire, as OAuth access tokens are.
        clients: OIDC client id → the SPIFFE ID it is known as here (``oidc``).
        client_claim: The claim naming the client in a caller token (``sub``,
            as in client-credentials tokens, or ``azp`` / ``client_id``).
        users: This issuer's tokens may name users (``A2AGW-User-Token``).
    """

    name: IssuerName
    kind: Literal["jwt-svid", "oidc"]
    trust_domain: str | None = None
    issuer: str | None = None
    jwks: Literal["workload-api"] | None = None
    jwks_file: Path | None = None
    jwks_url: str | None = None
    ca: Path | None = None
    refresh: Duration = timedelta(minutes=5)
    algorithms: tuple[str, ...] = ("ES256", "RS256")
    single_use_jti: bool = False
    clients: tuple[tuple[str, SpiffeId], ...] = Field(default=(), max_length=10_000)
    client_claim: Literal["sub", "azp", "client_id"] = "sub"
    users: bool = False

    @field_validator("clients", mode="before")
    @classmethod
    def _client_table(cls, value: object) -> object:
        return tuple(value.items()) if isinstance(value, dict) else value

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        refused = sorted(set(value) - SIGNING_ALGORITHMS)
        if refused or not value:
            raise ValueError(
                f"algorithms: {', '.join(refused) or 'none given'} not accepted; "
                f"choose from {', '.join(sorted(SIGNING_ALGORITHMS))}"
            )
        return value

    @field_validator("jwks_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _https_url(value, "jwks_url")

    @model_validator(mode="after")
    def _one_key_source(self) -> TokenIssuer:
        sources = [s for s in (self.jwks, self.jwks_file, self.jwks_url) if s is not None]
        if len(sources) != 1:
            raise ValueError("set exactly one of jwks, jwks_file, jwks_url")
        if self.jwks_url is not None and self.ca is None:
            raise ValueError("jwks_url needs ca: the CA trusted to serve it (pinned TLS)")
        if self.kind == "jwt-svid":
            if self.trust_domain is None or not _TRUST_DOMAIN.fullmatch(self.trust_domain):
                raise ValueError("a jwt-svid issuer needs trust_domain (e.g. example.org)")
            if self.clients:
                raise ValueError("clients is for oidc issuers (a JWT-SVID's sub is the caller)")
        else:
            if self.issuer is None:
                raise ValueError("an oidc issuer needs issuer (the iss its tokens carry)")
            if self.jwks is not None:
                raise ValueError('jwks = "workload-api" is for jwt-svid issuers')
        return self

    def spiffe_id_of(self, client: str) -> str | None:
        """The SPIFFE ID an OIDC client is known as here (None: not a caller)."""
        for name, spiffe_id in self.clients:
            if name == client:
                return spiffe_id
        return None


class TokenSettings(FrozenTable):
    """``[identity.tokens]``: which bearer tokens this agent accepts, and how.

    Attributes:
        audience: The ``aud`` a token must name (default: the agent's id).
        clock_skew: Leeway for ``exp``, ``nbf`` and ``iat`` (default 30 s).
        max_lifetime: Longest ``exp - iat`` accepted (default 1 h).
        max_token_bytes: Longest token read (default 8 KiB); a longer one is
            refused before it is decoded.
        token_only_callers: Accept a caller with a token and no client
            certificate, on the HTTPS bindings only (gRPC requires a client
            certificate at the handshake). Default false: a token must come
            with a certificate it is bound to.
        exchange_url: An RFC 8693 token endpoint (``https://``): a call onward
            for the same user carries a token obtained there for that peer.
        exchange_ca: The only CA trusted to serve ``exchange_url`` (pinned);
            the agent authenticates there with its own certificate.
        forward_user_tokens: Without ``exchange_url``, send the user's own
            token onward (default false: a call onward for a user is then
            refused ``USER_NOT_AUTHORIZED`` here, and nothing is sent).
        issuers: The trusted issuers.
    """

    audience: str | None = None
    clock_skew: Duration = timedelta(seconds=30)
    max_lifetime: Duration = timedelta(hours=1)
    max_token_bytes: int = Field(default=8192, ge=512, le=65536)
    token_only_callers: bool = False
    exchange_url: str | None = None
    exchange_ca: Path | None = None
    forward_user_tokens: bool = False
    issuers: tuple[TokenIssuer, ...] = Field(min_length=1)

    @field_validator("exchange_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _https_url(value, "exchange_url")

    @model_validator(mode="after")
    def _consistent(self) -> TokenSettings:
        names = [issuer.name for issuer in self.issuers]
        if len(names) != len(set(names)):
            raise ValueError("issuers: a name appears twice")
        domains = [i.trust_domain for i in self.issuers if i.kind == "jwt-svid"]
        if len(domains) != len(set(domains)):
            raise ValueError("issuers: two jwt-svid issuers of one trust domain")
        iss = [i.issuer for i in self.issuers if i.issuer is not None]
        if len(iss) != len(set(iss)):
            raise ValueError("issuers: two issuers with the same issuer (iss)")
        if (self.exchange_url is None) != (self.exchange_ca is None):
            raise ValueError("exchange_url and exchange_ca go together")
        if self.audience is not None and not self.audience.strip():
            raise ValueError("audience is empty")
        return self

    def audience_for(self, agent_id: str) -> str:
        """The audience tokens must name: ``audience``, else the agent's id."""
        return self.audience or agent_id


class IdentitySettings(FrozenTable):
    """``[identity]``: how callers other than by certificate are identified.

    Attributes:
        tokens: Bearer tokens (None, the default: none accepted).
    """

    tokens: TokenSettings | None = None

    def resolved(self, fix: Callable[[Path], Path]) -> IdentitySettings:
        """A copy with the file paths made absolute by ``fix``."""
        tokens = self.tokens
        if tokens is None:
            return self
        issuers = tuple(
            issuer.model_copy(
                update={
                    "jwks_file": None if issuer.jwks_file is None else fix(issuer.jwks_file),
                    "ca": None if issuer.ca is None else fix(issuer.ca),
                }
            )
            for issuer in tokens.issuers
        )
        exchange_ca = None if tokens.exchange_ca is None else fix(tokens.exchange_ca)
        return self.model_copy(
            update={
                "tokens": tokens.model_copy(update={"issuers": issuers, "exchange_ca": exchange_ca})
            }
        )


def spiffe_trust_domain(spiffe_id: str) -> str | None:
    """The trust domain of ``spiffe_id``, or None if it is not a SPIFFE ID."""
    if not is_spiffe_id(spiffe_id):
        return None
    return spiffe_id.split("/")[2]
