"""Gateway agents that take their identity from a real SPIRE agent (the SPIFFE Workload API).

SVIDs live ``SVID_TTL_SECONDS`` (20 s), so SPIRE rotates each one about every
10 s: every test here runs across rotations. The last test stops a SPIRE agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.audit.checkpoint_verify import verify_checkpoints
from gateway.audit.signer_archive import read_signers, signers_file
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, WorkloadApiTls
from gateway.errors import AgentConfigError, CapabilityNotGranted, PeerUnavailable
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from gateway.transport.svid_checks import issued_within
from gateway.transport.tls import TlsMaterial, channel_options
from policies.identity import svid_dns_name
from tests.agent_process import AgentProcess
from tests.spire.conftest import DAVE, Spire
from tests.support import (
    WriteCounter,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    write_policy,
)

ALICE, BOB, CAROL = spiffe("alice"), spiffe("bob"), spiffe("carol")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def workload_config(
    base: Path,
    agent_id: str,
    socket_address: str | None,
    grants: list[dict[str, Any]],
    peers: Sequence[Agent] = (),
) -> AgentConfig:
    """An agent config with ``[tls] source = "workload-api"`` (``socket`` omitted: from env)."""
    name = agent_id.rsplit("/", 1)[1]
    tls: dict[str, Any] = {"source": "workload-api", "start_timeout": 40, "expiry_warning": "1s"}
    if socket_address is not None:
        tls["socket"] = socket_address
    return AgentConfig.model_validate(
        {
            "id": agent_id,
            "tls": tls,
            "policy": write_policy(base / f"{name}-policy.toml", grants),
            "audit_db": base / f"{name}-audit.sqlite",
            "state_dir": base / f"{name}-state",
            "peers": [{"id": peer.config.id, "address": peer.address} for peer in peers],
            "audit_checkpoints": {"every_records": 1},
        }
    )


async def start_agent(config: AgentConfig, counter: WriteCounter | None = None) -> Agent:
    registry = standard_registry(counter or WriteCounter(), config.state_dir)
    agent = Agent(config, registry)
    await agent.start(watch_policy=False)
    return agent


async def eventually(condition: Callable[[], bool], what: str, seconds: float = 45.0) -> None:
    """Wait, bounded, until ``condition()`` holds."""
    for _ in range(int(seconds / 0.2)):
        if condition():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"never happened: {what}")


def served_serial(address: str, server_id: str, client: TlsMaterial) -> int:
    """Serial of the certificate a new TLS handshake with ``address`` presents."""
    host, port = address.rsplit(":", 1)
    roots = client.roots_for(server_id.split("/")[2])
    assert roots is not None
    context = ssl.create_default_context(cadata=roots.decode())
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "c.pem").write_bytes(client.cert_pem)
        (Path(folder) / "c.key").write_bytes(client.key_pem)
        context.load_cert_chain(Path(folder) / "c.pem", Path(folder) / "c.key")
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=svid_dns_name(server_id)) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_two_agents_get_svids_from_spire_and_keep_calling_across_rotation(
    spire: Spire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.transport")
    monkeypatch.setenv("SPIFFE_ENDPOINT_SOCKET", spire.alice_node.address)  # alice: from env
    counter = WriteCounter()
    alice = await start_agent(
        workload_config(tmp_path, ALICE, None, [grant("bob", ["text.echo"])]), counter
    )
    bob = await start_agent(
        workload_config(tmp_path, BOB, spire.bob_node.address, [], peers=[alice])
    )
    try:
        first_alice, first_bob = alice.live_tls.facts.serial, bob.live_tls.facts.serial
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "hello"})
        assert json.loads(answer.payload) == {"text": "hello"}
        with pytest.raises(CapabilityNotGranted):
            await bob.client(ALICE).invoke("notes.write", {"note": "x"})
        assert counter.calls == 0
        refused = [r for r in audit_rows(alice.config.audit_db) if r.decision == "refuse"]
        assert [(r.peer_id, r.capability, r.reason) for r in refused] == [
            (BOB, "notes.write", "CAPABILITY_NOT_GRANTED")
        ]

        calls = 0
        for _ in range(200):  # bounded: SPIRE rotates each 20 s SVID after ~10 s
            answer = await bob.client(ALICE).invoke("text.echo", {"text": f"call {calls}"})
            assert json.loads(answer.payload) == {"text": f"call {calls}"}
            calls += 1
            if alice.tls_stats().reloads_ok >= 1 and bob.tls_stats().reloads_ok >= 1:
                break
            await asyncio.sleep(0.25)
        assert alice.live_tls.facts.serial != first_alice
        assert bob.live_tls.facts.serial != first_bob
        assert alice.tls_stats().reloads_rejected == bob.tls_stats().reloads_rejected == 0
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "after"})
        assert json.loads(answer.payload) == {"text": "after"}
        # New handshakes present the rotated SVID; the metrics gauge follows it.
        assert served_serial(alice.address, ALICE, bob.tls) == alice.live_tls.facts.serial
        assert alice.tls_stats().serial == alice.live_tls.facts.serial
        assert any("certificate reloaded: serial" in r.message for r in caplog.records)
    finally:
        await bob.stop()
        await alice.stop()
    # Checkpoints were signed before and after the rotation, each with the SVID in force
    # then; the signers file kept them all, and every line verifies.
    signers = read_signers(signers_file(alice.config.checkpoint_file))
    assert len(signers) >= 2
    report = verify_checkpoints(
        open_audit_reader(alice.config.audit_db), alice.config.checkpoint_file, signers
    )
    assert report.ok and report.valid == report.checkpoints >= 2
    verified = cli(
        "audit",
        "verify",
        "--db",
        str(alice.config.audit_db),
        "--config",
        str(config_file(tmp_path / "alice.toml", alice.config)),
    )
    assert verified.returncode == 0, verified.stderr
    assert f"{report.checkpoints} of {report.checkpoints} checkpoints valid" in verified.stdout


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def config_file(path: Path, config: AgentConfig) -> Path:
    """``config`` as the TOML file an operator would write (the fields these tests set)."""
    tls = config.tls
    assert isinstance(tls, WorkloadApiTls)
    path.write_text(
        "\n".join(
            [
                f'id = "{config.id}"',
                f'listen = "{config.listen}"',
                f'policy = "{config.policy}"',
                f'audit_db = "{config.audit_db}"',
                f'state_dir = "{config.state_dir}"',
                "[tls]",
                'source = "workload-api"',
                *([f'socket = "{tls.socket}"'] if tls.socket else []),
                f"start_timeout = {tls.start_timeout}",
                "",
            ]
        )
    )
    return path


async def test_an_svid_that_loses_the_dns_name_is_taken_and_calls_go_on(
    spire: Spire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The registration entry loses ``-dns``: the next SVID carries only the SPIFFE ID. It is
    taken (the name is optional), and bob's calls go on: his clients made after it pin the URI
    SAN through the relay, as gRPC alone cannot."""
    alice = await start_agent(
        workload_config(tmp_path, ALICE, spire.alice_node.address, [grant("bob", ["text.echo"])])
    )
    bob = await start_agent(
        workload_config(tmp_path, BOB, spire.bob_node.address, [], peers=[alice])
    )
    try:
        spire.server.register(
            spire.alice_node.node_id,
            ALICE,
            dns=False,
            federates_with=("other.test",),
            update=True,
        )
        try:
            await eventually(lambda: not has_dns_name(alice.tls, ALICE), "an SVID without the name")
            for round_ in range(200):  # bounded: bob's SVID rotates (new clients) within ~10 s
                answer = await bob.client(ALICE).invoke("text.echo", {"text": f"round {round_}"})
                assert json.loads(answer.payload) == {"text": f"round {round_}"}
                if bob.client(ALICE).through_relay:
                    break
                await asyncio.sleep(0.25)
            assert bob.client(ALICE).through_relay
            assert not alice.live_tls.facts.derived_name
        finally:
            spire.server.register(
                spire.alice_node.node_id, ALICE, federates_with=("other.test",), update=True
            )
            await eventually(lambda: has_dns_name(alice.tls, ALICE), "an SVID with the name again")
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "named again"})
        assert json.loads(answer.payload) == {"text": "named again"}
        assert alice.tls_stats().reloads_rejected == 0
        assert not [r for r in caplog.records if "reload rejected" in r.message]
    finally:
        await bob.stop()
        await alice.stop()


def has_dns_name(material: TlsMaterial, spiffe_id: str) -> bool:
    leaf = x509.load_pem_x509_certificates(material.cert_pem)[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return svid_dns_name(spiffe_id) in san.get_values_for_type(x509.DNSName)


async def test_a_peer_of_a_federated_trust_domain_calls_under_a_grant(
    spire: Spire, tmp_path: Path
) -> None:
    alice = await start_agent(
        workload_config(
            tmp_path,
            ALICE,
            spire.alice_node.address,
            [{**grant("bob", ["text.echo"]), "peer": DAVE}],
        )
    )
    dave = await start_agent(
        workload_config(tmp_path, DAVE, spire.dave_node.address, [], peers=[alice])
    )
    bob = await start_agent(
        workload_config(tmp_path, BOB, spire.bob_node.address, [], peers=[dave])
    )
    try:
        # Both bundles came from the Workload API, own trust domain first.
        assert [domain for domain, _ in alice.tls.bundles] == ["example.org", "other.test"]
        assert [domain for domain, _ in dave.tls.bundles] == ["other.test", "example.org"]
        answer = await dave.client(ALICE).invoke("text.echo", {"text": "from other.test"})
        assert json.loads(answer.payload) == {"text": "from other.test"}
        await eventually(  # an allowed read is committed with the next batch
            lambda: (
                [(r.peer_id, r.decision) for r in audit_rows(alice.config.audit_db)]
                == [(DAVE, "allow")]
            ),
            "dave's call in alice's audit log",
        )
        # bob's entry does not federate: he has no bundle to verify dave by.
        assert [domain for domain, _ in bob.tls.bundles] == ["example.org"]
        with pytest.raises(PeerUnavailable, match=r"no trust bundle for trust domain other\.test"):
            await bob.client(DAVE).invoke("text.echo", {"text": "x"})
    finally:
        await bob.stop()
        await dave.stop()
        await alice.stop()


def _authority_id(output: str) -> str:
    found = re.search(r'"authority_id":\s*"([0-9a-f]+)"', output)
    assert found is not None, output
    return found.group(1)


def _roots(material: TlsMaterial) -> list[x509.Certificate]:
    pem = material.roots_for("example.org")
    assert pem is not None
    return x509.load_pem_x509_certificates(pem)


async def test_the_ca_rotating_reaches_the_agents_as_bundle_updates_and_calls_go_on(
    spire: Spire, tmp_path: Path
) -> None:
    alice = await start_agent(
        workload_config(tmp_path, ALICE, spire.alice_node.address, [grant("bob", ["text.echo"])])
    )
    bob = await start_agent(
        workload_config(tmp_path, BOB, spire.bob_node.address, [], peers=[alice])
    )
    try:
        old_roots = _roots(alice.tls)
        prepared = spire.server.run("localauthority", "x509", "prepare", "-output", "json")
        # The next CA is published first: a bundle update, the SVIDs unchanged.
        await eventually(
            lambda: len(_roots(alice.tls)) == len(_roots(bob.tls)) == len(old_roots) + 1,
            "the prepared CA in both agents' bundles",
        )
        new_root = next(r for r in _roots(alice.tls) if r not in old_roots)
        activated = spire.server.run(
            "localauthority", "x509", "activate", "-authorityID", _authority_id(prepared.stdout)
        )
        assert activated.returncode == 0

        def both_signed_by_the_new_ca() -> bool:
            leaves = [x509.load_pem_x509_certificates(a.tls.cert_pem) for a in (alice, bob)]
            return all(issued_within(chain, [new_root]) for chain in leaves)

        for round_ in range(200):  # bounded: the next SVID rotation is at most ~10 s away
            answer = await bob.client(ALICE).invoke("text.echo", {"text": f"round {round_}"})
            assert json.loads(answer.payload) == {"text": f"round {round_}"}
            if both_signed_by_the_new_ca():
                break
            await asyncio.sleep(0.25)
        assert both_signed_by_the_new_ca()
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "new CA"})
        assert json.loads(answer.payload) == {"text": "new CA"}
        assert alice.tls_stats().reloads_rejected == bob.tls_stats().reloads_rejected == 0
    finally:
        await bob.stop()
        await alice.stop()
        # A bundle set by hand does not follow the CA (a bundle endpoint would): set it anew.
        spire.other.federate_with(spire.server)


async def test_start_is_refused_without_the_workload_api_not_without_the_dns_name(
    spire: Spire, tmp_path: Path
) -> None:
    missing = f"unix://{tmp_path}/nothing-here.sock"
    config = workload_config(tmp_path, ALICE, missing, []).model_copy(
        update={
            "tls": workload_config(tmp_path, ALICE, missing, []).tls.model_copy(
                update={"start_timeout": 1.0}
            )
        }
    )
    with pytest.raises(AgentConfigError, match="no identity from the Workload API at unix://"):
        await Agent(config, standard_registry(WriteCounter(), tmp_path / "s")).start()
    served = cli("serve", "--config", str(config_file(tmp_path / "alice.toml", config)))
    assert served.returncode == 2
    assert served.stderr.startswith(
        f"error: no identity from the Workload API at {missing} within 1s: "
    )
    spire.server.register(spire.alice_node.node_id, CAROL, dns=False)
    carol = await start_agent(workload_config(tmp_path, CAROL, spire.alice_node.address, []))
    try:  # an SVID with only its SPIFFE ID serves: the derived DNS name is optional
        assert not has_dns_name(carol.tls, CAROL)
        assert not carol.live_tls.facts.derived_name
    finally:
        await carol.stop()


async def test_a_served_agent_process_takes_its_socket_from_the_environment_and_rotates(
    spire: Spire, tmp_path: Path
) -> None:
    config = workload_config(tmp_path, ALICE, None, [grant("bob", ["text.echo"])])
    path = config_file(tmp_path / "alice.toml", config)

    def launch(args: list[str], **kw: Any) -> subprocess.Popen[str]:
        env = {**os.environ, "SPIFFE_ENDPOINT_SOCKET": spire.alice_node.address}
        return subprocess.Popen(args, text=True, env=env, **kw)

    served = AgentProcess(path, launch)
    bob: Agent | None = None
    try:
        address = served.start()
        bob = await start_agent(workload_config(tmp_path, BOB, spire.bob_node.address, []))
        client = PeerClient(ALICE, address, bob.tls)
        try:
            answer = await client.invoke("text.echo", {"text": "to a process"})
            assert json.loads(answer.payload) == {"text": "to a process"}
        finally:
            await client.close()
        first = served_serial(address, ALICE, bob.tls)
        for _ in range(120):  # bounded: the served SVID rotates within ~10 s
            if served_serial(address, ALICE, bob.tls) != first:
                break
            await asyncio.sleep(0.25)
        assert served_serial(address, ALICE, bob.tls) != first
        client = PeerClient(ALICE, address, bob.tls)  # a new channel: a new handshake
        try:
            answer = await client.invoke("text.echo", {"text": "after rotation"})
            assert json.loads(answer.payload) == {"text": "after rotation"}
        finally:
            await client.close()
        assert served.terminate() == 0
        errors = served.errors(wait=10)
        assert "PRIVATE KEY" not in errors and "Traceback" not in errors
    finally:
        served.ensure_stopped()
        if bob is not None:
            await bob.stop()


async def _health(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=5
    )
    return int(reply.status)


async def test_spire_agent_stopped_keeps_serving_until_the_svid_expires_then_not_serving(
    spire: Spire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice = await start_agent(
        workload_config(tmp_path, ALICE, spire.alice_node.address, [grant("bob", ["text.echo"])])
    )
    bob = await start_agent(
        workload_config(tmp_path, BOB, spire.bob_node.address, [], peers=[alice])
    )
    # Opened before alice's SVID expires: an open connection outlives it.
    health = grpc.aio.secure_channel(
        alice.address, bob.tls.channel_credentials(ALICE), options=channel_options(ALICE)
    )
    try:
        assert await _health(health) == SERVING
        spire.alice_node.stop()
        await eventually(lambda: not alice.parts.workload_api.connected, "the stream noticed")  # type: ignore[union-attr]
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "last good SVID"})
        assert json.loads(answer.payload) == {"text": "last good SVID"}
        assert alice.live_tls.valid_now()
        await eventually(lambda: not alice.live_tls.valid_now(), "the SVID expired", 30)
        await eventually(lambda: not alice.health.serving, "NOT_SERVING")
        assert await _health(health) == NOT_SERVING
        assert alice.health.failing == ("own certificate",)
        assert alice.tls_stats().expiry_warnings >= 1
        messages = [r.message for r in caplog.records]
        assert any("Workload API at unix://" in m and "lost" in m for m in messages)
        assert any("expired at" in m and "NOT_SERVING until it delivers" in m for m in messages)

        spire.alice_node.start()  # back: a new SVID, SERVING again
        await eventually(lambda: alice.health.serving, "SERVING again")
        assert any("reachable again" in r.message for r in caplog.records)
        answer = await bob.client(ALICE).invoke("text.echo", {"text": "new SVID"})
        assert json.loads(answer.payload) == {"text": "new SVID"}
    finally:
        await health.close()
        await bob.stop()
        await alice.stop()
        if spire.alice_node.proc is None:
            spire.alice_node.start()
