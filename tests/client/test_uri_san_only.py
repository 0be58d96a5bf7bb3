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
from tests.helpers.a2a_upstream import SdkAgent, grpc_upstream, jsonrpc_upstream
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, started, write_policy
from tests.helpers.fronting import fronted, outcome, records

URSULA = spiffe("ursula")  # serves with an SVID that has only its URI SAN


def uri_only(pki: Pki, name: str) -> None:
    """Issue ``name``'s SVID without the derived DNS name (once per session).

    The session's PKI is shared: a name another test issued first with its DNS
    name would make these tests pass for the wrong reason, so that is an error.
    """
    pem = pki.dir / f"{name}.pem"
    if not pem.exists():
        issue(pki.dir, name, uri_san_only=True)
    leaf = x509.load_pem_x509_certificate(pem.read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    if san.get_values_for_type(x509.DNSName):
        raise AssertionError(
            f"{name!r} was issued with a DNS name elsewhere: use a name of its own"
        )


@pytest.fixture
async def ursula(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    uri_only(pki, "ursula")
    policy = write_policy(tmp_path / "ursula-policy.toml", [grant("bob", ["text.echo"])])
    agent = await started(agent_config(pki, tmp_path, "ursula", policy))
    yield agent
    await agent.stop()


def test_the_svid_has_no_dns_name(pki: Pki) -> None:
    uri_only(pki, "ursula")
    leaf = x509.load_pem_x509_certificate((pki.dir / "ursula.pem").read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [URSULA]
    assert san.get_values_for_type(x509.DNSName) == []


async def test_a_peer_call_reaches_it_pinned_by_its_uri_san(pki: Pki, ursula: Agent) -> None:
    async with PeerClient(URSULA, ursula.address, pki.material("bob")) as bob:
        result = await bob.invoke("text.echo", {"text": "hi"})
        again = await bob.invoke("text.echo", {"text": "again"})
        assert bob.through_relay
    assert (result.output(), again.output()) == ({"text": "hi"}, {"text": "again"})
    await ursula.audit.flush()
    rows = audit_rows(ursula.config.audit_db)
    assert [(r.peer_id, r.capability, r.decision) for r in rows] == [
        (spiffe("bob"), "text.echo", "allow"),
        (spiffe("bob"), "text.echo", "allow"),
    ]


@pytest.mark.parametrize("through_relay", [False, True])
async def test_another_identity_of_the_bundle_is_a_mismatch_and_gets_nothing(
    pki: Pki, ursula: Agent, through_relay: bool
) -> None:
    async with PeerClient(
        spiffe("carol"), ursula.address, pki.material("bob"), through_relay=through_relay
    ) as bob:
        with pytest.raises(PeerIdentityMismatch) as caught:
            await bob.invoke("text.echo", {"text": "for carol"}, timeout=5)
    assert "one URI SAN" in caught.value.message
    await ursula.audit.flush()
    assert audit_rows(ursula.config.audit_db) == []  # nothing reached ursula's pipeline


@pytest.mark.parametrize("through_relay", [False, True])
async def test_the_right_uri_from_a_ca_outside_the_bundle_never_connects(
    pki: Pki, tmp_path: Path, through_relay: bool
) -> None:
    if not (pki.foreign_dir / "ursula.pem").exists():
        issue(pki.foreign_dir, "ursula", uri_san_only=True)
    policy = write_policy(tmp_path / "ursula-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "ursula", policy)
    forged = config.model_copy(
        update={
            "tls": config.tls.model_copy(
                update={
                    "ca": pki.foreign_dir / "ca.pem",
                    "cert": pki.foreign_dir / "ursula.pem",
                    "key": pki.foreign_dir / "ursula.key",
                }
            )
        }
    )
    impostor = await started(forged)
    try:
        async with PeerClient(
            URSULA, impostor.address, pki.material("bob"), through_relay=through_relay
        ) as bob:
            with pytest.raises(PeerUnavailable):
                await bob.invoke("text.echo", {"text": "x"}, timeout=5)
            assert bob.through_relay is through_relay  # no fallback for an unverified chain
    finally:
        await impostor.stop()
    assert audit_rows(forged.audit_db) == []


async def test_the_relay_serves_no_other_process(
    pki: Pki, ursula: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    context = pinned_context(pki.material("bob"), URSULA, alpn=["h2"])
    relay = SpiffeRelay(ursula.address, context)
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
    assert out.strip() == b"0"  # closed unread: nothing came back from ursula
    assert "closed a connection from another process" in caplog.text
    assert not Path(socket_path).exists()  # noqa: ASYNC240 - after the relay closed
    await ursula.audit.flush()
    assert audit_rows(ursula.config.audit_db) == []


@pytest.fixture
async def legacy() -> SdkAgent:
    return SdkAgent()


async def test_a_grpc_upstream_with_only_its_uri_san(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    uri_only(pki, "ulrich")
    async with grpc_upstream(legacy, pki, "ulrich") as address:
        upstream = {"id": spiffe("ulrich"), "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, upstream) as bob:
            async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as alice:
                result = await alice.invoke("legacy.echo", {"text": "hi"})
            rows = await records(bob)
    assert result.output() == {"text": "echo: hi"}
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.echo", "allow", "OK")]


async def test_a_jsonrpc_upstream_with_only_its_uri_san(
    pki: Pki, tmp_path: Path, legacy: SdkAgent
) -> None:
    uri_only(pki, "ulrich")
    async with jsonrpc_upstream(legacy, pki, "ulrich") as url:
        upstream = {"id": spiffe("ulrich"), "binding": "jsonrpc", "url": url}
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
    uri_only(pki, "ulrich")
    upstreams = {"grpc": grpc_upstream, "jsonrpc": jsonrpc_upstream}
    async with upstreams[binding](legacy, pki, "ulrich") as where:
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
