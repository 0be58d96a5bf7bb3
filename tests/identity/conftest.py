"""Fixtures of the identity suites: the session's OIDC issuer, JWT-SVID keys, alice taking tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    standard_registry,
)
from tests.helpers.token_issuer import (
    SessionIssuer,
    SvidKeys,
    running_issuer,
    start_alice,
    token_settings,
)


@pytest.fixture(scope="session")
def issuer(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionIssuer]:
    """The session's OIDC issuer (its own CA, ES256 and RS256 keys)."""
    with running_issuer(tmp_path_factory.mktemp("issuer"), pki.dir / "ca.pem") as running:
        yield running


@pytest.fixture(scope="session")
def svid(tmp_path_factory: pytest.TempPathFactory) -> SvidKeys:
    return SvidKeys(tmp_path_factory.mktemp("svid"))


@pytest.fixture
async def alice(
    pki: Pki, tmp_path: Path, counter: WriteCounter, issuer: SessionIssuer, svid: SvidKeys
) -> AsyncIterator[Agent]:
    """alice over gRPC and HTTPS, taking tokens of the session issuer and JWT-SVIDs."""
    registry = standard_registry(counter, tmp_path / "alice-state")
    agent = await start_alice(pki, tmp_path, token_settings(issuer, svid), registry)
    yield agent
    await agent.stop()
