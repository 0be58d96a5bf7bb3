"""Where an agent is reachable once its servers are bound, and the card that says so."""

from __future__ import annotations

from gateway.config import AgentConfig
from gateway.server.a2a.card import BearerTokens, CardIssuer
from gateway.server.a2a.card_signing import CardSigner
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH


class Endpoints:
    """The bound ports, recorded by the gRPC and HTTPS services as they start.

    Attributes:
        grpc_port: The gRPC port (0 until bound).
        https_host: The host the HTTP bindings listen on ("" until bound).
        https_port: Their port (0 until bound, or when not served).
    """

    def __init__(self, config: AgentConfig, sign: CardSigner) -> None:
        self._config = config
        self._sign = sign
        self.grpc_port = 0
        self.https_host = ""
        self.https_port = 0

    @property
    def address(self) -> str:
        """``host:port`` the agent serves gRPC on (after start)."""
        host = self._config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.grpc_port}"

    @property
    def https_url(self) -> str:
        """``https://HOST:PORT`` of the A2A HTTP bindings ("" when not served)."""
        if not self.https_port:
            return ""
        host = self.https_host
        return f"https://{f'[{host}]' if ':' in host else host}:{self.https_port}"

    def card_issuer(self) -> CardIssuer:
        """The interfaces the agent serves and its card signer, for the A2A cards."""
        a2a = self._config.a2a
        base = a2a.http_url or self.https_url
        return CardIssuer(
            a2a.grpc_address or self.address,
            jsonrpc_url=f"{base}{JSONRPC_PATH}" if base else "",
            rest_url=f"{base}{REST_PATH}" if base else "",
            v0_3=a2a.v0_3_compat,
            sign=self._sign,
            bearer=self._bearer(),
            push=self._config.push.enabled,
        )

    def _bearer(self) -> BearerTokens | None:
        tokens = self._config.identity.tokens
        if tokens is None:
            return None
        return BearerTokens(
            audience=tokens.audience_for(self._config.id),
            token_only=tokens.token_only_callers,
            trust_domains=tuple(
                i.trust_domain for i in tokens.issuers if i.trust_domain is not None
            ),
            oidc_issuers=tuple(
                (i.name, i.issuer) for i in tokens.issuers if i.kind == "oidc" and i.issuer
            ),
        )
