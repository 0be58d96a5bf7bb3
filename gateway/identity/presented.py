"""The tokens a request presents, as every door reads them from its headers or metadata.

Two names, the same on every binding (gRPC metadata keys, HTTP header names;
both lowercase here):

- ``authorization: Bearer <token>``: the caller's own token (a JWT-SVID, or an
  OIDC client's token), beside or instead of its client certificate;
- ``a2agw-user-token: <token>``: the token of the user the call acts for.

A door builds one :class:`PresentedTokens` per request and hands it with the
call; the pipeline's ``identity`` check verifies it once and keeps the result
on it (:attr:`PresentedTokens.verified`), so the HTTP edge (which identifies a
request before reading its body) and the servicer behind it (which admits the
parsed request) verify a request's tokens once, and a single-use token is
spent once per request. Its ``repr`` never shows a token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policies.users import OnBehalfOf

AUTHORIZATION = "authorization"
"""The header (metadata key) of the caller's own token."""
USER_TOKEN = "a2agw-user-token"
"""The header (metadata key) of the user's token: ``A2AGW-User-Token`` over HTTP."""
_BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class VerifiedCaller:
    """Who the tokens proved: the caller's SPIFFE ID and the user it acts for.

    Attributes:
        peer_id: The caller (the certificate's, or the token's for a token-only caller).
        user: The user it acts for (None: none).
        expires_at: Epoch seconds at which the first of its tokens expires.
        certificate: The client certificate the tokens were bound to (None: none).
        credential: How the caller was identified, for audit details
            (``x509``, ``jwt-svid:NAME``, ``oidc:NAME``, each ``+x509`` when bound).
    """

    peer_id: str
    user: OnBehalfOf | None
    expires_at: float
    certificate: bytes | None
    credential: str


@dataclass(slots=True)
class PresentedTokens:
    """The tokens one request carries, and what the pipeline made of them.

    Attributes:
        bearer: The caller's token (``Authorization: Bearer``), "" if none.
        user: The user's token (``A2AGW-User-Token``), "" if none.
        problem: Why the headers are not usable (an ``Authorization`` that is
            not one Bearer token, a header sent twice); refused TOKEN_INVALID.
        token_only_door: The door may admit a caller by its token alone (the
            HTTPS bindings; gRPC requires a certificate at the handshake).
        verified: Set by the pipeline once it verified them (see module docstring).
    """

    bearer: str = ""
    user: str = ""
    problem: str = ""
    token_only_door: bool = False
    verified: VerifiedCaller | None = None

    def __repr__(self) -> str:
        # Which tokens, never their text.
        return (
            f"PresentedTokens(bearer={bool(self.bearer)}, user={bool(self.user)}, "
            f"problem={self.problem!r}, token_only_door={self.token_only_door})"
        )


def presented_tokens(
    metadata: Iterable[tuple[str, str | bytes]], *, token_only_door: bool = False
) -> PresentedTokens | None:
    """The tokens in ``metadata`` (lowercase keys), or None if it holds neither header."""
    found: PresentedTokens | None = None
    for key, value in metadata:
        if key != AUTHORIZATION and key != USER_TOKEN:
            continue
        if found is None:
            found = PresentedTokens(token_only_door=token_only_door)
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if key == AUTHORIZATION:
            if found.bearer or (found.problem and "authorization" in found.problem):
                found.problem = "more than one authorization header"
            elif text[: len(_BEARER)].lower() != _BEARER or not text[len(_BEARER) :].strip():
                found.problem = "the authorization header is not a Bearer token"
            else:
                found.bearer = text[len(_BEARER) :].strip()
        elif found.user:
            found.problem = f"more than one {USER_TOKEN} header"
        else:
            found.user = text.strip()
    return found
