"""SVIDs that carry only their SPIFFE ID (no derived DNS name) on every binding we call.

A SPIRE registration without ``-dns`` gives such SVIDs. The gateway's clients
pin the server by its one URI SAN: ``PeerClient`` and the gRPC upstream link go
through the relay of ``gateway.client.spiffe_relay``, the JSON-RPC upstream
link checks the SPIFFE ID in its own handshake. Pinning stays as strict as the
derived name was: another identity of the same bundle is PEER_IDENTITY_MISMATCH,
the right URI SAN from a CA outside the bundle never connects, and nothing is
sent to either.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509

from gateway.client.peer_client import PeerClient
from gateway.client.pinned_tls import pinned_context
from gateway.client.spiffe_relay import SpiffeRelay
from gateway.devtools.pki import issue
from gateway.errors import PeerIdentityMismatch, PeerUnavailable
from gateway.runtime.agent import Agent
from policies.identity import svid_dns_name
from tests.a2a_upstream import SdkAgent, grpc_upstream, jsonrpc_upstream
from tests.integration.test_upstreams import fronted, outcome, records
from tests.support import Pki, agent_config, audit_rows, grant, spiffe, started, write_policy

ERIN = spiffe("erin")  # serves with an SVID that has only its URI SAN


def uri_only(pki: Pki, name: str) -> None:
    """Issue ``name``'s SVID without the derived DNS name (once per session)."""
    if not (pki.dir / f"{name}.pem").exists():
        issue(pki.dir, name, uri_san_only=True)


@pytest.fixture
async def erin(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    uri_only(pki, "erin")
    policy = write_policy(tmp_path / "erin-policy.toml", [grant("bob", ["text.echo"])])
    agent = await started(agent_config(pki, tmp_path, "erin", policy))
    yield agent
    await agent.stop()


def test_the_svid_has_no_dns_name(pki: Pki) -> None:
    uri_only(pki, "erin")
    leaf = x509.load_pem_x509_certificate((pki.dir / "erin.pem").read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [ERIN]
    assert san.get_values_for_type(x509.DNSName) == []


async def test_a_peer_call_reaches_it_pinned_by_its_uri_san(pki: Pki, erin: Agent) -> None:
    async with PeerClient(ERIN, erin.address, pki.material("bob")) as bob:
        result = await bob.invoke("text.echo", {"text": "hi"})
        again = await bob.invoke("text.echo", {"text": "again"})
        assert bob.through_relay
    assert (result.output(), again.output()) == ({"text": "hi"}, {"text": "again"})
    await erin.audit.flush()
    rows = audit_rows(erin.config.audit_db)
    assert [(r.peer_id, r.capability, r.decision) for r in rows] == [
        (spiffe("bob"), "text.echo", "allow"),
        (spiffe("bob"), "text.echo", "allow"),
    ]


@pytest.mark.parametrize("through_relay", [False, True])
async def test_another_identity_of_the_bundle_is_a_mismatch_and_gets_nothing(
    pki: Pki, erin: Agent, through_relay: bool
) -> None:
    async with PeerClient(
        spiffe("carol"), erin.address, pki.material("bob"), through_relay=through_relay
    ) as bob:
        with pytest.raises(PeerIdentityMismatch) as caught:
            await bob.invoke("text.echo", {"text": "for carol"}, timeout=5)
    assert "one URI SAN" in caught.value.message
    await erin.audit.flush()
    assert audit_rows(erin.config.audit_db) == []  # nothing reached erin's pipeline


@pytest.mark.parametrize("through_relay", [False, True])
async def test_the_right_uri_from_a_ca_outside_the_bundle_never_connects(
    pki: Pki, tmp_path: Path, through_relay: bool
) -> None:
    if not (pki.foreign_dir / "erin.pem").exists():
        issue(pki.foreign_dir, "erin", uri_san_only=True)
    policy = write_policy(tmp_path / "erin-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "erin", policy)
    forged = config.model_copy(
        update={
            "tls": config.tls.model_copy(
                update={
                    "ca": pki.foreign_dir / "ca.pem",
                    "cert": pki.foreign_dir / "erin.pem",
                    "key": pki.foreign_dir / "erin.key",
                }
            )
        }
    )
    impostor = await started(forged)
    try:
        async with PeerClient(
            ERIN, impostor.address, pki.material("bob"), through_relay=through_relay
        ) as bob:
            with pytest.raises(PeerUnavailable):
                await bob.invoke("text.echo", {"text": "x"}, timeout=5)
            assert bob.through_relay is through_relay  # no fallback for an unverified chain
    finally:
        await impostor.stop()
    assert audit_rows(forged.audit_db) == []


async def test_the_relay_serves_no_other_process(
    pki: Pki, erin: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    context = pinned_context(pki.material("bob"), ERIN, alpn=["h2"])
    relay = SpiffeRelay(erin.address, context)
    socket_path = (await relay.start()).removeprefix("unix:")
    other = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n')\n"
        "    print(len(s.recv(100)))\n"
        "except OSError:\n"
        "    print(0)\n",
        socket_path,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await other.communicate()
    await relay.close()
    assert out.strip() == b"0"  # closed unread: nothing came back from erin
    assert "closed a connection from another process" in caplog.text
    assert not Path(socket_path).exists()  # noqa: ASYNC240 - after the relay closed
    await erin.audit.flush()
    assert audit_rows(erin.config.audit_db) == []


@pytest.fixture
async def legacy() -> SdkAgent:
    return SdkAgent()


async def test_a_grpc_upstream_with_only_its_uri_san(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    uri_only(pki, "frank")
    async with grpc_upstream(legacy, pki, "frank") as address:
        upstream = {"id": spiffe("frank"), "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, upstream) as bob:
            async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as alice:
                result = await alice.invoke("legacy.echo", {"text": "hi"})
            rows = await records(bob)
    assert result.output() == {"text": "echo: hi"}
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.echo", "allow", "OK")]


async def test_a_jsonrpc_upstream_with_only_its_uri_san(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    uri_only(pki, "frank")
    async with jsonrpc_upstream(legacy, pki, "frank") as url:
        upstream = {"id": spiffe("frank"), "binding": "jsonrpc", "url": url}
        async with fronted(pki, tmp_path, upstream) as bob:
            async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as alice:
                result = await alice.invoke("legacy.echo", {"text": "hi"})
            rows = await records(bob)
    assert result.output() == {"text": "echo: hi"}
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.echo", "allow", "OK")]


@pytest.mark.parametrize("binding", ["grpc", "jsonrpc"])
async def test_an_upstream_of_another_identity_is_a_mismatch_and_gets_nothing(
    pki: Pki, tmp_path: Path, legacy: SdkAgent, binding: str
) -> None:
    uri_only(pki, "frank")
    upstreams = {"grpc": grpc_upstream, "jsonrpc": jsonrpc_upstream}
    async with upstreams[binding](legacy, pki, "frank") as where:
        place = {"address": where} if binding == "grpc" else {"url": where}
        upstream = {"id": spiffe("legacy"), "binding": binding, **place}
        async with fronted(pki, tmp_path, upstream) as bob:
            async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as alice:
                with pytest.raises(PeerUnavailable):
                    await alice.invoke("legacy.echo", {"text": "hi"})
            rows = await records(bob)
    assert legacy.received == []
    assert [(outcome(r), r.detail) for r in rows] == [
        ((spiffe("alice"), "legacy.echo", "allow", "PEER_UNAVAILABLE"), "PEER_IDENTITY_MISMATCH")
    ]


def test_the_derived_name_is_still_what_pki_issue_adds_by_default(pki: Pki) -> None:
    leaf = x509.load_pem_x509_certificate((pki.dir / "alice.pem").read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [svid_dns_name(spiffe("alice"))]
