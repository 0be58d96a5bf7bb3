"""SVIDs with loopback or extra names complete real handshakes on BoringSSL and OpenSSL.

The dev CA used to constrain IP addresses to loopback; BoringSSL (gRPC) cannot
evaluate IP name constraints and failed every handshake with a certificate
holding an IP SAN ("unsupported name constraint type") while OpenSSL accepted
it. New CAs constrain DNS names only; CAs made before still serve plain SVIDs,
and ``pki issue`` refuses IP names from them with the way out.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gateway.cli.main import EXIT_USAGE, main
from gateway.devtools import pki
from gateway.errors import ConfigError
from policies.identity import svid_dns_name

DOMAIN = "example.org"
ALPHA = f"spiffe://{DOMAIN}/agent/alpha"
OLD_CONSTRAINTS = x509.NameConstraints(
    permitted_subtrees=[
        x509.DNSName("svid.a2agw.invalid"),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_network("127.0.0.0/8")),
        x509.IPAddress(ipaddress.ip_network("::1/128")),
    ],
    excluded_subtrees=None,
)
"""What ``pki init`` wrote before: loopback IP subtrees besides the DNS ones."""


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path / "pki", DOMAIN, permit_dns=["example.test"])
    return tmp_path / "pki"


@pytest.fixture
def old_ca_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(pki, "name_constraints", lambda permit_dns=(): OLD_CONSTRAINTS)
    pki.init_ca(tmp_path / "old-pki", DOMAIN)
    monkeypatch.undo()
    return tmp_path / "old-pki"


async def _serve(ca_dir: Path, identity: pki.IssuedIdentity) -> tuple[aio.Server, int]:
    credentials = grpc.ssl_server_credentials(
        [(identity.key_path.read_bytes(), identity.cert_path.read_bytes())],
        root_certificates=(ca_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


@pytest.fixture
async def served(ca_dir: Path) -> AsyncIterator[tuple[int, pki.IssuedIdentity]]:
    """alpha with every kind of extra name, serving health on 127.0.0.1."""
    identity = pki.issue(
        ca_dir,
        "alpha",
        loopback_sans=True,
        dns_names=["API.Example.test", "example.test", "localhost"],  # written lowercase, once
        ip_addresses=["127.0.0.1", "10.0.0.5"],
    )
    server, port = await _serve(ca_dir, identity)
    yield port, identity
    await server.stop(None)


async def _health(ca_dir: Path, client: pki.IssuedIdentity, target: str, name: str | None) -> int:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(ca_dir / "ca.pem").read_bytes(),
        private_key=client.key_path.read_bytes(),
        certificate_chain=client.cert_path.read_bytes(),
    )
    options = [] if name is None else [("grpc.ssl_target_name_override", name)]
    async with aio.secure_channel(target, credentials, options=options) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return int(reply.status)


def test_new_cas_constrain_dns_names_only_plus_the_permitted_suffixes(ca_dir: Path) -> None:
    ca = pki.CertificateAuthority.load(ca_dir).certificate
    ext = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert ext.critical is True
    assert list(ext.value.permitted_subtrees or []) == [
        x509.DNSName("svid.a2agw.invalid"),
        x509.DNSName("localhost"),
        x509.DNSName("example.test"),
    ]


def test_extra_names_are_in_the_certificate_once(served: tuple[int, pki.IssuedIdentity]) -> None:
    cert = x509.load_pem_x509_certificate(served[1].cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [ALPHA]
    assert san.get_values_for_type(x509.DNSName) == [
        svid_dns_name(ALPHA),
        "localhost",
        "api.example.test",
        "example.test",
    ]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.0.0.5")
    ]


@pytest.mark.parametrize(
    "name",
    [None, svid_dns_name(ALPHA), "localhost", "api.example.test", "example.test"],
    ids=["by-ip-san", "derived-name", "localhost", "extra-dns", "extra-dns-apex"],
)
@pytest.mark.parametrize("client_loopback", [False, True], ids=["plain-client", "loopback-client"])
async def test_grpc_boringssl_handshakes_with_loopback_and_extra_names(
    ca_dir: Path,
    served: tuple[int, pki.IssuedIdentity],
    name: str | None,
    client_loopback: bool,
) -> None:
    # Both sides verify a certificate with IP SANs: the server the client's
    # (loopback-client), the client the server's (every case).
    client = pki.issue(ca_dir, "beta", loopback_sans=client_loopback, overwrite=True)
    status = await _health(ca_dir, client, f"127.0.0.1:{served[0]}", name)
    assert status == health_pb2.HealthCheckResponse.SERVING


async def test_grpc_still_refuses_a_name_the_certificate_lacks(
    ca_dir: Path, served: tuple[int, pki.IssuedIdentity]
) -> None:
    client = pki.issue(ca_dir, "beta")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _health(ca_dir, client, f"127.0.0.1:{served[0]}", "other.example.test")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("server_hostname", ["127.0.0.1", "localhost", "api.example.test"])
async def test_python_ssl_openssl_verifies_the_same_certificate(
    ca_dir: Path, served: tuple[int, pki.IssuedIdentity], server_hostname: str
) -> None:
    client = pki.issue(ca_dir, "beta", loopback_sans=True)
    context = ssl.create_default_context(cafile=str(ca_dir / "ca.pem"))
    context.load_cert_chain(client.cert_path, client.key_path)
    context.set_alpn_protocols(["h2"])
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname

    def handshake() -> list[tuple[str, str]]:
        with (
            socket.create_connection(("127.0.0.1", served[0]), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=server_hostname) as tls,
        ):
            peer = tls.getpeercert()
            return list(peer["subjectAltName"])

    sans = await asyncio.to_thread(handshake)
    assert ("URI", ALPHA) in sans
    assert ("IP Address", "127.0.0.1") in sans


@pytest.mark.parametrize("name", [svid_dns_name(ALPHA), "localhost"])
async def test_an_old_ca_still_serves_svids_without_ip_names_over_grpc(
    old_ca_dir: Path, name: str
) -> None:
    server, port = await _serve(old_ca_dir, pki.issue(old_ca_dir, "alpha", dns_names=["localhost"]))
    try:
        client = pki.issue(old_ca_dir, "beta")
        status = await _health(old_ca_dir, client, f"127.0.0.1:{port}", name)
    finally:
        await server.stop(None)
    assert status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("loopback", "ips"), [(True, ()), (False, ("127.0.0.1",)), (False, ("10.0.0.5",))]
)
def test_an_old_ca_refuses_ip_names_with_the_way_out(
    old_ca_dir: Path, loopback: bool, ips: Sequence[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        pki.issue(old_ca_dir, "alpha", loopback_sans=loopback, ip_addresses=ips)
    assert caught.value.message == (
        "this CA's name constraints include IP addresses (made by an older pki init): "
        "gRPC's TLS (BoringSSL) refuses every certificate with an IP SAN under it; "
        "make a new CA (pki init --force, then re-issue every agent) or leave out "
        "--loopback-sans/--ip"
    )
    assert not (old_ca_dir / "alpha.pem").exists()


@pytest.mark.parametrize(
    ("dns", "ips", "problem"),
    [
        (["api.other.test"], [], "DNS name 'api.other.test' is outside the CA's name constraints"),
        (["notexample.test"], [], "is outside the CA's name constraints"),
        ([svid_dns_name("spiffe://example.org/agent/bob")], [], "stand for SPIFFE IDs"),
        (["svid.a2agw.invalid"], [], "stand for SPIFFE IDs"),
        (["*.example.test"], [], "wildcard DNS names are never issued"),
        (["bad_name.example.test"], [], "not a DNS name"),
        (["-x.example.test"], [], "not a DNS name"),
        ([], ["999.1.1.1"], "not an IP address: '999.1.1.1'"),
        ([], ["localhost"], "not an IP address: 'localhost'"),
    ],
)
def test_extra_names_a_verifier_would_refuse_are_never_issued(
    ca_dir: Path, dns: list[str], ips: list[str], problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        pki.issue(ca_dir, "alpha", dns_names=dns, ip_addresses=ips)
    assert problem in caught.value.message
    assert not (ca_dir / "alpha.pem").exists()


@pytest.mark.parametrize("suffix", ["*.example.test", "bad_name", ""])
def test_init_refuses_a_bad_permitted_suffix_before_writing(tmp_path: Path, suffix: str) -> None:
    with pytest.raises(ConfigError):
        pki.init_ca(tmp_path / "pki", DOMAIN, permit_dns=[suffix])
    assert not (tmp_path / "pki").exists()


def test_pki_cli_takes_permitted_suffixes_and_repeated_extra_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path / "pki")
    init = ["pki", "init", "--dir", directory, "--trust-domain", DOMAIN]
    assert main([*init, "--permit-dns", "example.test", "--permit-dns", "internal"]) == 0
    issue = ["pki", "issue", "alpha", "--dir", directory]
    extra = ["--dns", "api.example.test", "--dns", "db.internal", "--ip", "10.0.0.5"]
    assert main([*issue, *extra, "--ip", "::1"]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "pki" / "alpha.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName)[1:] == ["api.example.test", "db.internal"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("::1"),
    ]
    capsys.readouterr()
    assert main([*issue, "--force", "--dns", "api.other.test"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        "error: DNS name 'api.other.test' is outside the CA's name constraints (permitted: "
        "svid.a2agw.invalid, localhost, example.test, internal); make the CA with "
        "pki init --permit-dns api.other.test"
    )


_NODE_TLS = """
const fs = require('node:fs');
const tls = require('node:tls');
const [ca, cert, key, port, host, servername] = process.argv.slice(1);
const socket = tls.connect({
  host: '127.0.0.1', port: Number(port), ca: fs.readFileSync(ca), cert: fs.readFileSync(cert),
  key: fs.readFileSync(key), ALPNProtocols: ['h2'], ...(servername ? { servername } : {}),
  checkServerIdentity: (_, peer) => tls.checkServerIdentity(host, peer),
}, () => { console.log(socket.authorized ? 'authorized' : socket.authorizationError); socket.end(); });
socket.on('error', (err) => { console.log('error: ' + err.message); process.exitCode = 1; });
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "api.example.test"])
async def test_node_tls_verifies_the_same_certificate(
    ca_dir: Path, served: tuple[int, pki.IssuedIdentity], host: str
) -> None:
    if shutil.which("node") is None:
        pytest.skip("node not installed (.ci/run installs it)")
    client = pki.issue(ca_dir, "beta")
    servername = "" if host == "127.0.0.1" else host  # SNI takes names, not addresses
    args = [str(ca_dir / "ca.pem"), str(client.cert_path), str(client.key_path)]
    done = await asyncio.to_thread(
        subprocess.run,
        ["node", "-e", _NODE_TLS, *args, str(served[0]), host, servername],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "authorized"), done.stderr


def test_the_dev_pki_doc_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "dev-pki.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split() for line in block.splitlines() if line.strip()]
    assert commands and all(words[0] == "a2a-gateway" for words in commands)
    monkeypatch.chdir(tmp_path)
    for words in commands:
        assert main(words[1:]) == 0, words
    carol = x509.load_pem_x509_certificate((tmp_path / "pki" / "carol.pem").read_bytes())
    san = carol.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName)[1:] == ["api.example.test", "localhost"]


def test_re_issuing_without_the_extra_names_says_which_it_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A newcomer re-issued alice's localhost certificate with 'pki issue alice --force' to
    # rotate it: the new one lost DNS:localhost, and every HTTPS client failed its hostname
    # check from the reload on, with nothing said when it was issued.
    directory = str(tmp_path / "pki")
    assert main(["pki", "init", "--dir", directory, "--trust-domain", DOMAIN]) == 0
    issue = ["pki", "issue", "alpha", "--dir", directory]
    assert main([*issue, "--dns", "localhost", "--ip", "127.0.0.1"]) == 0
    capsys.readouterr()
    assert main([*issue, "--force", "--dns", "localhost"]) == 0
    assert capsys.readouterr().err == (
        "warning: the certificate replaced also named IP:127.0.0.1; this one does not "
        "(pass the same --dns / --ip / --loopback-sans to keep them)\n"
    )
    assert main([*issue, "--force", "--dns", "localhost"]) == 0  # same names: nothing to say
    assert capsys.readouterr().err == ""
