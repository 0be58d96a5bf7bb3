"""Defects found by probing the SPIRE identity surface, each with its regression test.

- A CA dropped from the trust bundle (``spire-server localauthority x509 taint`` then
  ``revoke``) stayed trusted on connections opened before: with one trust bundle the
  per-call check looked at the certificate's validity period only, so an SVID of the
  revoked CA (or a certificate minted with its stolen key) went on calling; on HTTPS
  even a new connection did, resuming a TLS session of before the revocation.
- Of two SVIDs for the agent's SPIFFE ID (two registration entries, one without ``-dns``)
  the last the Workload API listed was taken: start or rotation failed at random.
- ``config check`` said ``ok`` of a Workload API config whose socket ``serve`` cannot
  find (no ``socket``, no ``SPIFFE_ENDPOINT_SOCKET``; or the variable not ``unix://``).

Its own SPIRE deployment (the CA is revoked here, which the module fixture's other
tests must not see): one trust domain, spire-agents ``alice-node`` and ``bob-node``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from spiffe import WorkloadApiClient
from spiffe.errors import PySpiffeError
from spiffe.workloadapi.x509_context import X509Context

from gateway.client.peer_client import PeerClient
from gateway.config import TlsFiles
from gateway.devtools.pki import init_ca, issue
from gateway.errors import ConfigError, Unauthenticated
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.transport.live_tls import LiveTls
from gateway.transport.svid_checks import issued_within
from gateway.transport.tls import TlsMaterial
from gateway.transport.workload_api import SOCKET_ENV, material_from_context
from policies.identity import svid_dns_name
from tests.a2a_http_support import jsonrpc, message_params, our_reason
from tests.spire.spire_lab import SpireAgent, SpireLab, SpireServer, spire_bin
from tests.spire.test_workload_api import (
    ALICE,
    BOB,
    CAROL,
    eventually,
    start_agent,
    workload_config,
)
from tests.support import (
    audit_rows,
    grant,
    spiffe,
    write_policy,
)

LONG_SVID_SECONDS = 1800
"""Bob's SVID outlives the revocation, so its validity period cannot be what refuses it."""


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[SpireServer, SpireAgent, SpireAgent]]:
    spire = SpireLab(spire_bin())
    try:
        server = spire.server("example.org")
        alice_node, bob_node = spire.agent(server, "alice-node"), spire.agent(server, "bob-node")
        server.register(alice_node.node_id, ALICE)
        server.run(
            *("entry", "create", "-parentID", bob_node.node_id, "-spiffeID", BOB),
            *("-selector", f"unix:uid:{os.getuid()}", "-dns", svid_dns_name(BOB)),
            *("-x509SVIDTTL", str(LONG_SVID_SECONDS)),
        )
        yield server, alice_node, bob_node
    finally:
        spire.close()


async def _svid(node: SpireAgent, spiffe_id: str) -> TlsMaterial:
    """The SVID ``node`` hands out now (bounded wait while it is attested)."""
    problem: Exception | None = None
    for _ in range(120):
        try:
            with WorkloadApiClient(node.address, default_timeout=5) as client:
                return material_from_context(client.fetch_x509_context(), spiffe_id)
        except (PySpiffeError, ConfigError) as err:
            problem = err
        await asyncio.sleep(0.5)
    raise AssertionError(f"no SVID for {spiffe_id}: {problem}")


def _roots(material: TlsMaterial) -> list[x509.Certificate]:
    pem = material.roots_for("example.org")
    assert pem is not None
    return x509.load_pem_x509_certificates(pem)


def _authority_id(output: str, which: str = "") -> str:
    """The authority id in ``output`` (the first one, or the one under key ``which``)."""
    head = rf'"{which}":\s*\{{[^}}]*' if which else ""
    found = re.search(head + r'"authority_id":\s*"([0-9a-f]+)"', output)
    assert found is not None, output
    return found.group(1)


def _https_context(material: TlsMaterial) -> ssl.SSLContext:
    """A client context presenting ``material``'s SVID, trusting its bundle."""
    context = ssl.create_default_context(cadata=material.ca_pem.decode("ascii"))
    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder) / "c.pem", Path(folder) / "c.key"
        cert.write_bytes(material.cert_pem)
        key.write_bytes(material.key_pem)
        context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _https_send(
    port: int, context: ssl.SSLContext, session: ssl.SSLSession | None
) -> tuple[bool, dict[str, Any], ssl.SSLSession | None]:
    """A JSON-RPC SendMessage to alice on a new connection (resuming ``session``): whether
    it resumed, the reply, the session to resume later."""
    body = json.dumps(jsonrpc("SendMessage", message_params("text.echo", {"text": "x"})))
    head = (
        f"POST {JSONRPC_PATH} HTTP/1.1\r\nHost: alice\r\nContent-Type: application/json\r\n"
        f"A2A-Version: 1.0\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=svid_dns_name(ALICE), session=session) as tls,
    ):
        tls.sendall((head + body).encode())
        reply = b""
        with contextlib.suppress(ssl.SSLZeroReturnError, ssl.SSLEOFError):
            while chunk := tls.recv(65536):
                reply += chunk
        _, _, payload = reply.partition(b"\r\n\r\n")
        return bool(tls.session_reused), json.loads(payload), tls.session


async def test_a_revoked_ca_is_not_trusted_on_a_connection_opened_before(
    lab: tuple[SpireServer, SpireAgent, SpireAgent], tmp_path: Path
) -> None:
    server, alice_node, bob_node = lab
    config = workload_config(
        tmp_path,
        ALICE,
        alice_node.address,
        [grant("bob", ["text.echo"]), grant("carol", ["text.echo"])],
    )
    alice = await start_agent(
        config.model_copy(
            update={"a2a": config.a2a.model_copy(update={"http_listen": "127.0.0.1:0"})}
        )
    )
    assert alice.parts.https is not None
    https_port = alice.parts.endpoints.https_port
    old_svid = await _svid(bob_node, BOB)
    held = PeerClient(ALICE, alice.address, old_svid)  # one connection, opened now
    fresh: PeerClient | None = None
    try:
        answer = await held.invoke("text.echo", {"text": "before"})
        assert json.loads(answer.payload) == {"text": "before"}
        https = _https_context(old_svid)
        _, reply, session = await asyncio.to_thread(_https_send, https_port, https, None)
        assert reply["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", reply
        old_roots = _roots(alice.tls)
        assert len(old_roots) == 1 and len(alice.tls.bundles) == 1

        prepared = server.run("localauthority", "x509", "prepare", "-output", "json")
        await eventually(lambda: len(_roots(alice.tls)) == 2, "the prepared CA in alice's bundle")
        server.run(
            "localauthority", "x509", "activate", "-authorityID",
            _authority_id(prepared.stdout),
        )  # fmt: skip
        shown = server.run("localauthority", "x509", "show", "-output", "json").stdout
        old_authority = _authority_id(shown, "old")
        server.run("localauthority", "x509", "taint", "-authorityID", old_authority)
        server.run("localauthority", "x509", "revoke", "-authorityID", old_authority)
        await eventually(
            lambda: not any(root in _roots(alice.tls) for root in old_roots),
            "the revoked CA dropped from alice's bundle",
        )
        old_leaf = x509.load_pem_x509_certificate(old_svid.cert_pem)
        assert old_leaf.not_valid_after_utc > datetime.now(UTC)  # within its validity period

        with pytest.raises(Unauthenticated) as refused:
            await held.invoke("text.echo", {"text": "after the revocation"})
        assert refused.value.reason == "UNAUTHENTICATED"
        assert refused.value.message == (
            "the caller's certificate was issued by a CA the trust bundle no longer holds"
        )
        last = audit_rows(tmp_path / "alice-audit.sqlite")[-1]
        assert (last.peer_id, last.decision, last.reason, last.detail) == (
            "",
            "refuse",
            "UNAUTHENTICATED",
            "issuer dropped from the trust bundle after this connection was made",
        )
        # HTTPS: a new connection resuming the TLS session of before skips the handshake's
        # verification against the new bundle: the call itself is refused.
        try:
            resumed, reply, _ = await asyncio.to_thread(_https_send, https_port, https, session)
        except (ssl.SSLError, OSError):  # not resumed: the handshake refused the revoked CA
            pass
        else:
            assert resumed, reply  # nothing else gets past the handshake
            assert our_reason(reply["error"]["data"]) == "UNAUTHENTICATED", reply
            last = audit_rows(tmp_path / "alice-audit.sqlite")[-1]
            assert (last.decision, last.reason) == ("refuse", "UNAUTHENTICATED")

        # A certificate of the new CA is not refused: carol, registered after the revocation.
        server.register(bob_node.node_id, CAROL)
        carol = await _svid(bob_node, CAROL)
        assert issued_within(x509.load_pem_x509_certificates(carol.cert_pem), _roots(alice.tls))
        fresh = PeerClient(ALICE, alice.address, carol)
        answer = await fresh.invoke("text.echo", {"text": "new CA"})
        assert json.loads(answer.payload) == {"text": "new CA"}
    finally:
        await held.close()
        if fresh is not None:
            await fresh.close()
        await alice.stop()


def _config_check(tmp_path: Path, socket_line: str, env_socket: str | None) -> tuple[int, str]:
    """``config check`` of a Workload API config: exit code and its certificate line."""
    policy = write_policy(tmp_path / "policy.toml", [])
    config = tmp_path / "alice.toml"
    config.write_text(
        f'id = "{ALICE}"\nlisten = "127.0.0.1:0"\npolicy = "{policy}"\n'
        f'audit_db = "{tmp_path}/audit.sqlite"\nstate_dir = "{tmp_path}/state"\n'
        f'[tls]\nsource = "workload-api"\n{socket_line}\n'
    )
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    if env_socket is not None:
        env[SOCKET_ENV] = env_socket
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "config", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if ": certificate" in line]
    assert len(lines) == 1, done.stdout + done.stderr
    return done.returncode, lines[0]


def test_config_check_says_what_serve_would_find_of_the_workload_api(
    lab: tuple[SpireServer, SpireAgent, SpireAgent], tmp_path: Path
) -> None:
    _, alice_node, _ = lab
    # Neither `socket` nor the environment variable: serve refuses, and so does the check
    # (it said "ok: ... (SPIFFE_ENDPOINT_SOCKET)").
    assert _config_check(tmp_path, "", None) == (
        1,
        'error: certificate: [tls] source = "workload-api" needs socket = '
        '"unix:///path/to/agent.sock" or the SPIFFE_ENDPOINT_SOCKET environment variable',
    )
    assert _config_check(tmp_path, "", "tcp://127.0.0.1:1") == (
        1,
        "error: certificate: Workload API socket 'tcp://127.0.0.1:1': expected "
        "unix:///absolute/path/to/agent.sock (the only Workload API address supported)",
    )
    missing = f"unix://{tmp_path}/nothing.sock"
    assert _config_check(tmp_path, f'socket = "{missing}"', None) == (
        0,
        f"warning: certificate: from the SPIFFE Workload API ({missing}): no socket there "
        "now (is the SPIRE agent running?)",
    )
    # The check asks the Workload API as serve would, and says what the SVID is.
    code, line = _config_check(tmp_path, "", alice_node.address)
    assert code == 0
    assert line.startswith(
        f"ok: certificate: from the SPIFFE Workload API ({alice_node.address}): {ALICE}, expires "
    ), line
    # A quarter of the SVID's lifetime (SPIRE backdates not_before: longer than its TTL).
    assert re.search(r" \(\d+s left, warned within \d+s\)$", line), line


def test_a_ca_taken_out_of_the_ca_file_is_not_trusted_on_open_connections(
    tmp_path: Path,
) -> None:
    """The same rule for a CA file (the handshake's roots; no SPIRE): a certificate of the
    CA taken out is refused, one of the CA in force is not, and a CA put back counts again."""
    old, new = tmp_path / "pki", tmp_path / "new-pki"
    init_ca(old, "example.org")
    init_ca(new, "example.org")
    for folder in (old, new):
        issue(folder, "alice")
        issue(folder, "bob")
    live = tmp_path / "live"
    live.mkdir()

    def use(ca_pem: bytes, folder: Path) -> None:
        (live / "ca.pem").write_bytes(ca_pem)
        (live / "alice.pem").write_bytes((folder / "alice.pem").read_bytes())
        (live / "alice.key").write_bytes((folder / "alice.key").read_bytes())

    use((old / "ca.pem").read_bytes(), old)
    files = TlsFiles.model_validate(
        {"ca": live / "ca.pem", "cert": live / "alice.pem", "key": live / "alice.key"}
    )
    tls = LiveTls(ALICE, files)
    old_bob, new_bob = (old / "bob.pem").read_bytes(), (new / "bob.pem").read_bytes()
    tls.check_peer_issuer(old_bob, BOB)

    use((new / "ca.pem").read_bytes(), new)  # the old CA taken out
    assert tls.reload() is None
    with pytest.raises(Unauthenticated) as refused:
        tls.check_peer_issuer(old_bob, BOB)
    assert refused.value.message == (
        "the caller's certificate was issued by a CA the trust bundle no longer holds"
    )
    tls.check_peer_issuer(new_bob, BOB)

    use((new / "ca.pem").read_bytes() + (old / "ca.pem").read_bytes(), new)  # put back
    assert tls.reload() is None
    tls.check_peer_issuer(old_bob, BOB)
    tls.check_peer_issuer(new_bob, BOB)


def _dns_names(material: TlsMaterial) -> list[str]:
    leaf = x509.load_pem_x509_certificate(material.cert_pem)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName)


async def test_of_two_entries_for_the_agent_the_svid_with_the_dns_name_is_taken(
    lab: tuple[SpireServer, SpireAgent, SpireAgent], tmp_path: Path
) -> None:
    """Two registration entries for one SPIFFE ID, one without ``-dns``: the Workload API
    hands out both SVIDs, in an order that varies. The last one was taken, so the agent
    refused to start (or rejected the next rotation) about every other time."""
    server, alice_node, _ = lab
    erin = spiffe("erin")
    server.register(alice_node.node_id, erin, dns=False)
    server.run(
        *("entry", "create", "-parentID", alice_node.node_id, "-spiffeID", erin),
        *("-selector", f"unix:uid:{os.getuid()}", "-selector", f"unix:gid:{os.getgid()}"),
        *("-dns", svid_dns_name(erin)),
    )
    context: X509Context | None = None
    for _ in range(120):  # bounded: until the spire-agent hands out both
        with contextlib.suppress(PySpiffeError):
            with WorkloadApiClient(alice_node.address, default_timeout=5) as client:
                context = client.fetch_x509_context()
            if sum(str(s.spiffe_id) == erin for s in context.x509_svids) == 2:
                break
        await asyncio.sleep(0.5)
    assert context is not None
    svids = [s for s in context.x509_svids if str(s.spiffe_id) == erin]
    assert len(svids) == 2
    for order in (svids, svids[::-1]):
        material = material_from_context(X509Context(order, context.x509_bundle_set), erin)
        assert _dns_names(material) == [svid_dns_name(erin)]
    agent = await start_agent(workload_config(tmp_path, erin, alice_node.address, []))
    try:
        assert _dns_names(agent.tls) == [svid_dns_name(erin)]
    finally:
        await agent.stop()
