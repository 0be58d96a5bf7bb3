"""Fixtures of the identity suites: the session's OIDC issuer, JWT-SVID keys, alice taking tokens."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry import CapabilityRegistry
from gateway.config import AgentConfig, IdentitySettings
from gateway.runtime.agent import Agent
from tests.a2a_http_support import serving_https
from tests.identity.issuer import SessionIssuer, SigningKey, es256_key, running_issuer, sign
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)


@pytest.fixture(scope="session")
def issuer(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionIssuer]:
    """The session's OIDC issuer (its own CA, ES256 and RS256 keys)."""
    with running_issuer(tmp_path_factory.mktemp("issuer"), pki.dir / "ca.pem") as running:
        yield running


class SvidKeys:
    """JWT-SVID signing for example.org without SPIRE: a key and its bundle file."""

    def __init__(self, folder: Path) -> None:
        self.key: SigningKey = es256_key("svid-1")
        self.bundle = folder / "jwt-bundle.json"
        self.bundle.write_text(json.dumps({"keys": [{**self.key.jwk(), "use": "jwt-svid"}]}))

    def token(self, name: str, aud: str, *, lifetime: int = 300, **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": spiffe(name), "aud": [aud], "iat": now, "exp": now + lifetime, **claims}
        return sign(self.key, body)


@pytest.fixture(scope="session")
def svid(tmp_path_factory: pytest.TempPathFactory) -> SvidKeys:
    return SvidKeys(tmp_path_factory.mktemp("svid"))


def token_settings(issuer: SessionIssuer, svid: SvidKeys, **overrides: Any) -> IdentitySettings:
    """``[identity.tokens]`` trusting the session's issuer (users, clients) and JWT-SVIDs."""
    tokens: dict[str, Any] = {
        "token_only_callers": True,
        "issuers": [
            {
                "name": "spire",
                "kind": "jwt-svid",
                "trust_domain": "example.org",
                "jwks_file": str(svid.bundle),
            },
            {
                "name": "corp",
                "kind": "oidc",
                "issuer": issuer.url,
                "jwks_url": issuer.jwks_url,
                "ca": str(issuer.ca_file),
                "users": True,
                "clients": {"bob-client": spiffe("bob"), "carol-client": spiffe("carol")},
            },
        ],
        **overrides,
    }
    return IdentitySettings.model_validate({"tokens": tokens})


def with_tokens(config: AgentConfig, identity: IdentitySettings) -> AgentConfig:
    return AgentConfig.model_validate({**config.model_dump(), "identity": identity.model_dump()})


ALICE = spiffe("alice")


def alice_grants() -> list[dict[str, Any]]:
    return [
        grant("bob", ["text.echo@^1", "text.search@^1", "kv.put@1"], max_payload_bytes=4096),
        {
            **grant("carol", ["text.echo", "kv.put"]),
            "users": "required",
            "user_claims": {"groups": "finance"},
            "when": {"short-text": "!has(input.text) || size(input.text) < 12"},
        },
    ]


async def start_alice(
    pki: Pki, tmp_path: Path, identity: IdentitySettings, registry: CapabilityRegistry
) -> Agent:
    policy = write_policy(tmp_path / "alice-policy.toml", alice_grants())
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    return await started(with_tokens(config, identity), registry)


@pytest.fixture
async def alice(
    pki: Pki, tmp_path: Path, counter: WriteCounter, issuer: SessionIssuer, svid: SvidKeys
) -> AsyncIterator[Agent]:
    """alice over gRPC and HTTPS, taking tokens of the session issuer and JWT-SVIDs."""
    registry = standard_registry(counter, tmp_path / "alice-state")
    agent = await start_alice(pki, tmp_path, token_settings(issuer, svid), registry)
    yield agent
    await agent.stop()
