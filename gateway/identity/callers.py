"""Who is calling, and for whom, from a client certificate and the tokens beside it.

The rules (each refusal audited by the pipeline, the tokens never)::

    certificate, no token     the certificate's SPIFFE ID (as without [identity.tokens])
    certificate and token     the token must be bound to the certificate: a JWT-SVID
                              whose sub is the certificate's SPIFFE ID, an OIDC client
                              mapped to it, or an RFC 8705 cnf.x5t#S256 equal to the
                              certificate's thumbprint; else TOKEN_NOT_BOUND. The caller
                              is the certificate's SPIFFE ID.
    token, no certificate     only on a door that may (the HTTPS bindings) and with
                              token_only_callers; the caller is the token's identity
                              (a JWT-SVID's sub, or the SPIFFE ID its OIDC client maps
                              to); a token with cnf (made for a certificate) is refused
                              TOKEN_NOT_BOUND without it
    neither                   UNAUTHENTICATED, as before

A user token (``A2AGW-User-Token``) is then verified the same way, from an
issuer with ``users = true``, and must name the caller as its actor: its
``act.sub`` (RFC 8693 delegation), else its ``azp`` (the OIDC client it was
issued to), either the caller's SPIFFE ID or a client mapped to it; else
TOKEN_NOT_BOUND. Its ``sub`` is the user, never the caller itself (a client's own
token names no user: TOKEN_INVALID); the actor chain is ``act.sub``, then
each nested ``act``'s, mapped to SPIFFE IDs where the issuer knows the client.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gateway.errors import TokenInvalid, TokenNotBound, Unauthenticated
from gateway.identity.presented import PresentedTokens, VerifiedCaller
from gateway.identity.verifier import KeysMissing, TokenVerifier, VerifiedToken
from policies.identity import is_spiffe_id, trust_domain_of
from policies.users import OnBehalfOf

MAX_ACTORS = 8
"""Deepest actor chain read from a user token's nested ``act`` claims."""


@lru_cache(maxsize=1024)
def certificate_thumbprint(pem: bytes) -> str:
    """RFC 8705's ``x5t#S256`` of a PEM certificate: base64url SHA-256 of its DER, unpadded."""
    der = x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()


class TokenIdentities:
    """Resolves callers and users from presented tokens, for one agent."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier
        self._token_only = verifier.settings.token_only_callers

    async def identify(
        self, cert_peer_id: str, cert_pem: bytes | None, presented: PresentedTokens
    ) -> VerifiedCaller:
        """The caller (and user) ``presented`` proves beside the certificate, if any.

        ``cert_peer_id`` is the certificate's SPIFFE ID ("" without one).

        Raises:
            Unauthenticated: or a TokenInvalid subclass (see the module docstring).
        """
        if presented.problem:
            raise TokenInvalid(presented.problem)
        credential = "x509" if cert_peer_id else ""
        peer_id, expires = cert_peer_id, float("inf")
        if presented.bearer:
            token = await self._verified(presented.bearer)
            peer_id, credential = self._caller(token, cert_peer_id, cert_pem, presented)
            expires = token.expires_at
        elif not cert_peer_id:
            raise Unauthenticated("no verified client certificate")
        user = None
        if presented.user:
            token = await self._verified(presented.user)
            user = self._user(token, peer_id)
            expires = min(expires, token.expires_at)
        return VerifiedCaller(peer_id, user, expires, cert_pem, credential)

    async def user_of(self, token: str, actor: str) -> OnBehalfOf:
        """The user a token names, verified as any user token whose actor must be ``actor``
        (this agent, for a task it starts for that user: ``Agent.acting_for``).

        Raises:
            TokenInvalid: or a subclass, as for a user token sent with a call.
        """
        return self._user(await self._verified(token), actor)

    async def _verified(self, token: str) -> VerifiedToken:
        try:
            return self.verifier.verify(token)
        except KeysMissing as missing:
            await missing.keys.refetch_for_unknown_kid()
        try:
            return self.verifier.verify(token)
        except KeysMissing as missing:  # fetched just now by another call: no second fetch
            raise TokenInvalid(
                f"issuer {missing.keys.issuer.name} has no key with that kid",
                detail=f"{missing.keys.issuer.name}: unknown kid",
            ) from None

    def _caller(
        self,
        token: VerifiedToken,
        cert_peer_id: str,
        cert_pem: bytes | None,
        presented: PresentedTokens,
    ) -> tuple[str, str]:
        issuer = token.issuer
        named = _token_identity(token)
        credential = f"{issuer.kind}:{issuer.name}"
        thumbprint = _cnf_thumbprint(token.claims)
        if cert_peer_id:
            assert cert_pem is not None
            if thumbprint is not None:
                if thumbprint != certificate_thumbprint(cert_pem):
                    raise TokenNotBound(
                        "the token is bound to another certificate (cnf.x5t#S256)",
                        detail=f"{credential}: cnf thumbprint differs",
                    )
            elif named != cert_peer_id:
                raise TokenNotBound(
                    "the token names another identity than the client certificate",
                    detail=f"{credential}: token names {named or 'no mapped client'}",
                )
            return cert_peer_id, credential + "+x509"
        if thumbprint is not None:
            raise TokenNotBound(
                "the token is bound to a certificate (cnf.x5t#S256) this request did not present"
            )
        if not (presented.token_only_door and self._token_only):
            raise Unauthenticated(
                "a client certificate is needed here; a token alone is not accepted"
                + ("" if presented.token_only_door else " on this binding")
            )
        if not named:
            raise TokenInvalid(
                f"the token's client is not known here (issuer {issuer.name})",
                detail=f"{credential}: client not in clients",
            )
        return named, credential

    def _user(self, token: VerifiedToken, caller: str) -> OnBehalfOf:
        issuer, claims = token.issuer, token.claims
        if not issuer.users:
            raise TokenInvalid(
                f"issuer {issuer.name} is not trusted for users",
                detail=f"{issuer.name}: users = false",
            )
        act = claims.get("act")
        actor = act.get("sub") if isinstance(act, Mapping) else claims.get("azp")
        actors = _actor_chain(token) if isinstance(act, Mapping) else (caller,)
        if not isinstance(actor, str) or _as_spiffe(token, actor) != caller:
            raise TokenNotBound(
                "the user token was not issued to this caller (act.sub or azp)",
                detail=f"{issuer.name}: user token actor is not the caller",
            )
        if _as_spiffe(token, claims["sub"]) == caller:
            # The caller's own (client) token names no user: a call for nobody would
            # pass a grant's users = "required" as one for a user.
            raise TokenInvalid(
                "the user token names the caller itself, not a user",
                detail=f"{issuer.name}: user token sub is the caller",
            )
        return OnBehalfOf.of(claims["sub"], issuer.issuer or issuer.name, claims, actors)


def _token_identity(token: VerifiedToken) -> str:
    """The SPIFFE ID a caller token names ("" if its OIDC client is not mapped)."""
    issuer, claims = token.issuer, token.claims
    if issuer.kind == "jwt-svid":
        sub = str(claims["sub"])
        if not is_spiffe_id(sub) or trust_domain_of(sub) != issuer.trust_domain:
            raise TokenInvalid(
                f"a JWT-SVID's sub must be a SPIFFE ID of {issuer.trust_domain}",
                detail=f"{issuer.name}: sub not a SPIFFE ID of its trust domain",
            )
        return sub
    client = claims.get(issuer.client_claim)
    return (issuer.spiffe_id_of(client) or "") if isinstance(client, str) else ""


def _as_spiffe(token: VerifiedToken, actor: str) -> str:
    """An actor as a SPIFFE ID: itself, or the one its OIDC client is mapped to."""
    if is_spiffe_id(actor):
        return actor
    return token.issuer.spiffe_id_of(actor) or ""


def _actor_chain(token: VerifiedToken) -> tuple[str, ...]:
    chain: list[str] = []
    act: Any = token.claims.get("act")
    while isinstance(act, Mapping) and len(chain) < MAX_ACTORS:
        sub = act.get("sub")
        if not isinstance(sub, str):
            break
        chain.append(_as_spiffe(token, sub) or sub[:256])
        act = act.get("act")
    return tuple(chain)


def _cnf_thumbprint(claims: Mapping[str, Any]) -> str | None:
    cnf = claims.get("cnf")
    if not isinstance(cnf, Mapping):
        return None
    thumbprint = cnf.get("x5t#S256")
    return thumbprint if isinstance(thumbprint, str) else None
