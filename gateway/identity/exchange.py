"""Carrying a user onward: a narrower token for each peer, by RFC 8693 token exchange.

When a capability (``ctx.call_peer``) or a plan step calls a further peer for
the user its call acts for, the call carries a token for that user made for
that peer alone: this agent asks the configured token endpoint
(``[identity.tokens] exchange_url``) to exchange the user's token (the
``subject_token``) for one whose audience is the peer's SPIFFE ID. It
authenticates there with its own client certificate (RFC 8705
``tls_client_auth``), over TLS trusting only ``exchange_ca``; the issuer puts
this agent in the new token's ``act`` claim, so the peer sees the actor chain.

Without an endpoint the user's own token is forwarded only if
``forward_user_tokens`` says so; otherwise the call is refused
``USER_NOT_AUTHORIZED`` before anything is sent: a call for a user never
leaves without that user, and never with the raw inbound token by default.

Fronted upstreams (``[[upstreams]]``, ``[[mcp_upstreams]]``) are not peers in
this sense: they are called under this agent's own identity and get no user
token (docs/identity.md).

Exchanged tokens are cached per (user token, audience) until shortly before
they expire. No token is ever logged or audited.
"""

from __future__ import annotations

import hashlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.config.identity import TokenSettings
from gateway.errors import UserNotAuthorized
from gateway.identity.keys import FETCH_SECONDS, pinned_context
from policies.users import OnBehalfOf

EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
_MARGIN_SECONDS = 30.0
_MAX_CACHED = 4096

ClientCertificate = Callable[[], tuple[Path, Path]]
"""The agent's certificate and key files, as they are now (rotation changes them)."""


@dataclass(frozen=True, slots=True)
class ActingFor:
    """The user an outbound call is made for, and the token that proves it.

    Attributes:
        user: The verified user (subject, issuer, claims, actors).
        token: The user token this agent was given (the exchange's subject
            token); never logged, never audited, never shown by ``repr``.
    """

    user: OnBehalfOf
    token: str

    def __repr__(self) -> str:
        return f"ActingFor(user={self.user!r})"


class TokenExchange:
    """Gets tokens for a user to carry to each peer (see the module docstring)."""

    def __init__(self, settings: TokenSettings, client_certificate: ClientCertificate) -> None:
        self._url = settings.exchange_url
        self._ca = settings.exchange_ca
        self._forward = settings.forward_user_tokens
        self._client_certificate = client_certificate
        self._cache: dict[tuple[str, str], tuple[str, float]] = {}
        self._context: tuple[tuple[Path, Path, float, float], ssl.SSLContext] | None = None

    async def token_for(self, acting: ActingFor, audience: str) -> str:
        """A token for ``acting``'s user, for ``audience`` (a peer's SPIFFE ID).

        Raises:
            UserNotAuthorized: no way to carry the user to that peer (no
                endpoint and no forwarding), or the endpoint refused or failed
                (nothing was sent to the peer).
        """
        if self._url is None:
            if self._forward:
                return acting.token
            raise UserNotAuthorized(
                "this call acts for a user, and this agent has no way to carry the user "
                "onward (no exchange_url; forward_user_tokens is off); nothing was sent"
            )
        key = (hashlib.sha256(acting.token.encode()).hexdigest(), audience)
        cached = self._cache.get(key)
        if cached is not None and cached[1] > time.time():
            return cached[0]
        token, lifetime = await self._exchange(acting.token, audience)
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        self._cache[key] = (token, time.time() + max(0.0, lifetime - _MARGIN_SECONDS))
        return token

    async def _exchange(self, subject_token: str, audience: str) -> tuple[str, float]:
        assert self._url is not None
        form = {
            "grant_type": EXCHANGE_GRANT,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
            "audience": audience,
        }
        try:
            async with httpx.AsyncClient(
                verify=self._ssl_context(), timeout=FETCH_SECONDS, trust_env=False
            ) as client:
                response = await client.post(self._url, data=form)
        except httpx.HTTPError as err:
            raise UserNotAuthorized(
                "the token endpoint could not be reached to carry the user onward; "
                "nothing was sent",
                detail=f"token exchange: {type(err).__name__}",
            ) from err
        try:
            answer = response.json() if response.status_code == 200 else {}
        except ValueError:
            answer = {}
        token = answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise UserNotAuthorized(
                "the token endpoint gave no token for this user to that peer; nothing was sent",
                detail=f"token exchange: HTTP {response.status_code}",
            )
        lifetime = answer.get("expires_in")
        valid = float(lifetime) if isinstance(lifetime, int | float) else 60.0
        return token, valid

    def _ssl_context(self) -> ssl.SSLContext:
        """The pinned context with the agent's certificate, made again when the files change."""
        cert, key = self._client_certificate()
        stamp = (cert, key, cert.stat().st_mtime, key.stat().st_mtime)
        if self._context is None or self._context[0] != stamp:
            assert self._ca is not None
            context = pinned_context(self._ca)
            context.load_cert_chain(cert, key)
            self._context = (stamp, context)
        return self._context[1]
