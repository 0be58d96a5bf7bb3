"""The public keys of one token issuer, by ``kid``: from a file, a pinned URL or SPIFFE.

Each issuer of ``[identity.tokens]`` has one :class:`IssuerKeys`. Keys are
looked up only by the ``kid`` a token names, inside its own issuer's set, so a
``kid`` can neither reach another issuer's key nor a file or URL: it is a
dictionary key, nothing more. A key is used only for the algorithms of its
type (``alg_fits``): an RSA key never checks an ``ES256`` signature, an EC key
never an ``RS256`` one, and no key ever an HMAC.

Where keys come from:

- ``jwks_file``: a JWKS (or a SPIFFE bundle, whose ``x509-svid`` keys are
  skipped), read at start and again on every refresh;
- ``jwks_url``: fetched over HTTPS trusting only the configured CA (pinned),
  at most 1 MiB, 5 s;
- ``jwks = "workload-api"``: the trust domain's JWT bundle from the SPIFFE
  Workload API (py-spiffe, on a worker thread).

A refresh that fails keeps the keys in force (logged): an issuer that is down
for a while does not log everyone out. The keys are refreshed every
``refresh``, and at once for a ``kid`` not in the set, at most every
:data:`MIN_REFETCH_SECONDS`: a caller sending made-up ``kid`` values costs one
fetch per 30 s, not one per call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt import PyJWK
from jwt.exceptions import PyJWKError

from gateway.config.identity import TokenIssuer
from gateway.errors import AgentConfigError

_log = logging.getLogger(__name__)

MIN_REFETCH_SECONDS = 30.0
"""Least time between two fetches asked for by an unknown ``kid``."""
MAX_JWKS_BYTES = 1 << 20
FETCH_SECONDS = 5.0
MIN_RSA_BITS = 2048

PublicKey = (
    ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
)
_CURVES = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}


def alg_fits(alg: str, key: PublicKey) -> bool:
    """True if ``key`` is of the type (and curve) the JWS algorithm ``alg`` signs with."""
    if alg in _CURVES:
        return isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == _CURVES[alg]
    if alg[:2] in ("RS", "PS"):
        return isinstance(key, rsa.RSAPublicKey) and key.key_size >= MIN_RSA_BITS
    if alg == "EdDSA":
        return isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey)
    return False


def keys_from_jwks(document: Mapping[str, Any]) -> dict[str, PublicKey]:
    """The usable signing keys of a JWKS (or SPIFFE bundle), by ``kid``.

    Skipped: keys without a ``kid``, keys for another use (``enc``,
    ``x509-svid``), symmetric or private keys, and keys PyJWT cannot read.
    """
    found: dict[str, PublicKey] = {}
    entries = document.get("keys")
    if not isinstance(entries, list):
        raise ValueError("not a JWKS: no keys list")
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        kid, use = entry.get("kid"), entry.get("use")
        if not isinstance(kid, str) or not kid or use not in (None, "sig", "jwt-svid"):
            continue
        if entry.get("kty") == "oct" or "d" in entry:
            continue  # a shared secret or a private key is never a verification key here
        try:
            key = PyJWK.from_dict(entry).key
        except (PyJWKError, ValueError, TypeError):
            continue
        if isinstance(key, PublicKey):
            found[kid] = key
    return found


@dataclass(slots=True)
class _State:
    keys: dict[str, PublicKey]
    fetched_at: float
    asked_at: float = 0.0


class IssuerKeys:
    """One issuer's keys, refreshed in the background and on an unknown ``kid``."""

    def __init__(self, issuer: TokenIssuer, fetch: Callable[[], Awaitable[dict[str, PublicKey]]]):
        self.issuer = issuer
        self._fetch = fetch
        self._state = _State({}, 0.0)
        self._lock = asyncio.Lock()
        self.generation = 0
        """Counts changes of the key set (verified tokens are cached per generation)."""

    def get(self, kid: str) -> PublicKey | None:
        """The key named ``kid``, if the set holds it."""
        return self._state.keys.get(kid)

    @property
    def count(self) -> int:
        """How many keys the set holds."""
        return len(self._state.keys)

    def may_refetch(self) -> bool:
        """True if an unknown ``kid`` may fetch the keys now (rate-limited)."""
        return time.monotonic() - self._state.asked_at >= MIN_REFETCH_SECONDS

    async def refetch_for_unknown_kid(self) -> None:
        """Fetch the keys again for a ``kid`` the set lacks, unless one did so lately."""
        async with self._lock:
            if not self.may_refetch():
                return
            self._state.asked_at = time.monotonic()
            await self._refresh_locked()

    async def refresh(self) -> bool:
        """Fetch the keys; keep the old set if that fails. True if it succeeded."""
        async with self._lock:
            return await self._refresh_locked()

    async def _refresh_locked(self) -> bool:
        try:
            keys = await self._fetch()
        except Exception as err:
            _log.warning(
                "token issuer %s: keys not refreshed (%s: %s); keeping %d key(s)",
                self.issuer.name,
                type(err).__name__,
                str(err)[:200],
                self.count,
            )
            return False
        if keys != self._state.keys:
            self.generation += 1
        self._state.keys = keys
        self._state.fetched_at = time.monotonic()
        return True

    async def keep_fresh(self) -> None:
        """Refresh every ``refresh`` until cancelled (a failed one is tried again sooner)."""
        every = self.issuer.refresh.total_seconds()
        while True:
            ok = await self.refresh()
            await asyncio.sleep(every if ok else min(every, MIN_REFETCH_SECONDS))


def file_fetcher(path: Path) -> Callable[[], Awaitable[dict[str, PublicKey]]]:
    """Reads a JWKS file (on a worker thread)."""

    def read() -> dict[str, PublicKey]:
        with path.open("rb") as handle:
            data = handle.read(MAX_JWKS_BYTES + 1)
        if len(data) > MAX_JWKS_BYTES:
            raise ValueError(f"{path}: larger than {MAX_JWKS_BYTES} bytes")
        return keys_from_jwks(json.loads(data))

    async def fetch() -> dict[str, PublicKey]:
        return await asyncio.to_thread(read)

    return fetch


def pinned_context(ca: Path) -> ssl.SSLContext:
    """A TLS client context that trusts ``ca`` only (no system roots), TLS 1.2 or later.

    Raises:
        AgentConfigError: the CA file cannot be read as PEM certificates.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies peer and name; no roots yet
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as err:
        raise AgentConfigError(f"{ca}: cannot be read as a CA ({err})") from err
    return context


def url_fetcher(url: str, ca: Path) -> Callable[[], Awaitable[dict[str, PublicKey]]]:
    """Fetches a JWKS over HTTPS, trusting only ``ca`` (the context is built once)."""
    context = pinned_context(ca)

    async def fetch() -> dict[str, PublicKey]:
        async with (
            httpx.AsyncClient(verify=context, timeout=FETCH_SECONDS, trust_env=False) as client,
            client.stream("GET", url, headers={"accept": "application/json"}) as response,
        ):
            response.raise_for_status()
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
        return keys_from_jwks(json.loads(bytes(body)))

    return fetch


def workload_api_fetcher(
    socket: str | None, trust_domain: str
) -> Callable[[], Awaitable[dict[str, PublicKey]]]:
    """Fetches ``trust_domain``'s JWT bundle from the SPIFFE Workload API (worker thread)."""

    def read() -> dict[str, PublicKey]:
        from spiffe import WorkloadApiClient  # the SPIFFE client's gRPC stack, only if used

        with WorkloadApiClient(socket) as client:
            bundles = client.fetch_jwt_bundles(timeout=FETCH_SECONDS)
        for bundle in bundles.bundles:
            if bundle.trust_domain.name == trust_domain:
                return {
                    kid: key
                    for kid, key in bundle.jwt_authorities.items()
                    if isinstance(key, PublicKey)
                }
        raise ValueError(f"the Workload API has no JWT bundle for {trust_domain}")

    async def fetch() -> dict[str, PublicKey]:
        return await asyncio.to_thread(read)

    return fetch
