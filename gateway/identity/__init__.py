"""Bearer identities beside certificates: token verification, callers, users, exchange.

``[identity.tokens]`` (``gateway.config.identity``) names the trusted issuers;
:func:`token_identities` builds what the pipeline's ``identity`` check asks
(:class:`~gateway.identity.callers.TokenIdentities`) and the keys it needs to
keep fresh. See docs/identity.md.

Modules: ``presented`` (the tokens a request carries), ``keys`` (an issuer's
keys), ``verifier`` (one token), ``spent_ids`` (single-use tokens),
``callers`` (who calls and for whom), ``exchange`` (RFC 8693 for calls onward).
"""

from __future__ import annotations

import asyncio
import logging

from gateway.config.identity import TokenIssuer, TokenSettings
from gateway.errors import AgentConfigError
from gateway.identity.callers import TokenIdentities
from gateway.identity.keys import IssuerKeys, file_fetcher, url_fetcher, workload_api_fetcher
from gateway.identity.presented import (
    AUTHORIZATION,
    USER_TOKEN,
    PresentedTokens,
    VerifiedCaller,
    presented_tokens,
)
from gateway.identity.verifier import TokenVerifier

__all__ = [
    "AUTHORIZATION",
    "USER_TOKEN",
    "PresentedTokens",
    "TokenIdentities",
    "VerifiedCaller",
    "keep_keys_fresh",
    "load_keys",
    "presented_tokens",
    "token_identities",
]

_log = logging.getLogger(__name__)


def issuer_keys(issuer: TokenIssuer, workload_api_socket: str | None) -> IssuerKeys:
    """The key set of one configured issuer (empty until its first refresh)."""
    if issuer.jwks_file is not None:
        return IssuerKeys(issuer, file_fetcher(issuer.jwks_file))
    if issuer.jwks_url is not None:
        assert issuer.ca is not None  # the config requires it
        return IssuerKeys(issuer, url_fetcher(issuer.jwks_url, issuer.ca))
    assert issuer.trust_domain is not None
    return IssuerKeys(issuer, workload_api_fetcher(workload_api_socket, issuer.trust_domain))


def token_identities(
    settings: TokenSettings, agent_id: str, workload_api_socket: str | None = None
) -> TokenIdentities:
    """What the pipeline asks about presented tokens (no I/O: keys load when started)."""
    keys = [issuer_keys(issuer, workload_api_socket) for issuer in settings.issuers]
    return TokenIdentities(TokenVerifier(settings, agent_id, keys))


async def load_keys(identities: TokenIdentities) -> None:
    """Load every issuer's keys once, before the agent serves.

    Raises:
        AgentConfigError: a ``jwks_file`` cannot be read (an operator's mistake,
            said at once). A URL or Workload API that does not answer yet is
            logged, and its tokens are refused until its keys arrive.
    """
    for keys in identities.verifier.keys:
        if not await keys.refresh() and keys.issuer.jwks_file is not None:
            raise AgentConfigError(
                f"identity.tokens issuer {keys.issuer.name}: jwks_file "
                f"{keys.issuer.jwks_file} could not be read as a JWKS"
            )
        _log.info("token issuer %s: %d key(s)", keys.issuer.name, keys.count)


async def keep_keys_fresh(identities: TokenIdentities) -> None:
    """Refresh every issuer's keys on its own ``refresh`` period, until cancelled."""
    await asyncio.gather(*(_fresh(keys) for keys in identities.verifier.keys))


async def _fresh(keys: IssuerKeys) -> None:
    await asyncio.sleep(keys.issuer.refresh.total_seconds())
    await keys.keep_fresh()
