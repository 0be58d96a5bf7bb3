"""A client certificate that expires while its connection is open stops being an identity.

TLS checks a certificate's validity once, at the handshake; gRPC channels and
HTTPS keep-alive connections then live on for as long as the client keeps
them. Found by reviewing the identity step: a peer whose SVID had expired (a
lost Workload API, a retired workload whose short-lived certificate was not
renewed) went on calling, allowed, on a connection it had opened in time.
The decision path now checks the certificate's validity at every call.
"""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import Unauthenticated
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH
from tests.helpers.a2a_http import V1_HEADERS, jsonrpc, message_params, serving_https
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

pytestmark = pytest.mark.slow

LIFETIME = timedelta(seconds=3)


async def until_past(moment: datetime) -> None:
    """Sleep until ``moment`` has passed (bounded by the short lifetime)."""
    await asyncio.sleep((moment - datetime.now(UTC)).total_seconds() + 0.2)
    assert datetime.now(UTC) > moment


async def test_a_grpc_channel_whose_certificate_expired_is_refused(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    not_after = datetime.now(UTC).replace(microsecond=0) + LIFETIME
    material = pki.odd_material(uris=[spiffe("bob")], not_after=not_after)
    async with PeerClient(alice.config.id, alice.address, material) as bob:
        await bob.invoke("notes.write", {"note": "in time"})
        assert counter.calls == 1
        await until_past(not_after)
        before = len(audit_rows(alice.config.audit_db))
        with pytest.raises(Unauthenticated):
            await bob.invoke("notes.write", {"note": "too late"})
    await alice.audit.flush()
    added = audit_rows(alice.config.audit_db)[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [("", "refuse", "UNAUTHENTICATED")]
    assert counter.calls == 1


async def test_an_https_connection_whose_certificate_expired_is_refused(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["notes.write"])])
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    not_after = datetime.now(UTC).replace(microsecond=0) + LIFETIME
    cert, key = pki.ca.mint(uris=[spiffe("bob")], not_after=not_after)
    (tmp_path / "bob-short.pem").write_bytes(cert)
    (tmp_path / "bob-short.key").write_bytes(key)
    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    context.load_cert_chain(tmp_path / "bob-short.pem", tmp_path / "bob-short.key")
    url = agent.https_url + JSONRPC_PATH

    def body(n: int) -> dict[str, object]:
        params = message_params("notes.write", {"note": "x"}, message_id=f"expiry-{n}")
        return jsonrpc("SendMessage", params)

    try:
        async with httpx.AsyncClient(verify=context, timeout=10.0) as client:  # one connection
            first = await client.post(url, json=body(1), headers=V1_HEADERS)
            assert "result" in first.json()
            assert counter.calls == 1
            await until_past(not_after)
            before = len(audit_rows(agent.config.audit_db))
            late = await client.post(url, json=body(2), headers=V1_HEADERS)
        assert late.json()["error"]["message"].startswith("UNAUTHENTICATED: ")
        await agent.audit.flush()
        added = audit_rows(agent.config.audit_db)[before:]
        assert [(r.peer_id, r.decision, r.reason) for r in added] == [
            ("", "refuse", "UNAUTHENTICATED")
        ]
        assert counter.calls == 1
    finally:
        await agent.stop()
