"""The development PKI: CA and SVID contents, file handling, and a real mTLS handshake."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.devtools import pki
from gateway.errors import ConfigError, Unauthenticated
from gateway.transport.tls import load_pem_file
from policies.identity import spiffe_id_from_pem, svid_dns_name

ALPHA = "spiffe://example.org/agent/alpha"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path / "pki", "example.org")
    return tmp_path / "pki"


@pytest.fixture
def ca() -> pki.CertificateAuthority:
    return pki.CertificateAuthority.create("example.org")


def test_init_ca_writes_a_spiffe_ca(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "pki"
    cert_path = pki.init_ca(directory, "example.org")

    assert cert_path == directory / "ca.pem"
    assert sorted(os.listdir(directory)) == ["ca.key", "ca.pem"]
    assert _mode(directory / "ca.key") == 0o600
    cert = _load(cert_path.read_bytes())
    cert.verify_directly_issued_by(cert)
    assert cert.subject == x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "A2A Peer Gateway dev CA"),
            x509.NameAttribute(NameOID.COMMON_NAME, "example.org"),
        ]
    )
    assert cert.issuer == cert.subject
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert (basic.critical, basic.value.ca, basic.value.path_length) == (True, True, 0)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical is True
    assert (usage.value.key_cert_sign, usage.value.crl_sign) == (True, True)
    assert usage.value.digital_signature is False
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://example.org"]
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    public_key = cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name == "secp256r1"


def test_issue_writes_an_svid_chained_to_the_ca(ca_dir: Path) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    identity = pki.issue(ca_dir, "alpha")

    assert identity == pki.IssuedIdentity(
        spiffe_id=ALPHA, cert_path=ca_dir / "alpha.pem", key_path=ca_dir / "alpha.key"
    )
    assert sorted(os.listdir(ca_dir)) == ["alpha.key", "alpha.pem", "ca.key", "ca.pem"]
    assert _mode(identity.key_path) == 0o600
    assert _mode(ca_dir / "ca.key") == 0o600
    cert_pem = identity.cert_path.read_bytes()
    assert spiffe_id_from_pem(cert_pem) == ALPHA
    cert, ca_cert = _load(cert_pem), _load((ca_dir / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    skew = cert.not_valid_before_utc - (before - timedelta(minutes=5))
    assert timedelta(0) <= skew <= timedelta(seconds=5)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == timedelta(days=30, minutes=5)

    key = serialization.load_pem_private_key(identity.key_path.read_bytes(), password=None)
    assert identity.key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == cert.public_key()


def test_svid_extensions_follow_the_spec(ca: pki.CertificateAuthority) -> None:
    cert = _load(ca.issue_svid(ALPHA)[0])
    extensions = cert.extensions

    san = extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical is False
    assert san.value.get_values_for_type(x509.UniformResourceIdentifier) == [ALPHA]
    assert san.value.get_values_for_type(x509.DNSName) == [svid_dns_name(ALPHA)]
    assert san.value.get_values_for_type(x509.IPAddress) == []
    basic = extensions.get_extension_for_class(x509.BasicConstraints)
    assert (basic.critical, basic.value.ca) == (True, False)
    usage = extensions.get_extension_for_class(x509.KeyUsage)
    assert (usage.critical, usage.value.digital_signature) == (True, True)
    assert (usage.value.key_cert_sign, usage.value.crl_sign) == (False, False)
    eku = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    aki = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ca_ski.value.digest
    ski = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    assert cert.serial_number != _load(ca.issue_svid(ALPHA)[0]).serial_number


def test_init_ca_refuses_to_overwrite_unless_asked(ca_dir: Path) -> None:
    original = (ca_dir / "ca.pem").read_bytes()
    with pytest.raises(ConfigError) as caught:
        pki.init_ca(ca_dir, "example.org")
    assert caught.value.message == (
        f"CA already exists at {ca_dir / 'ca.pem'} (pass --force to replace it)"
    )
    assert (ca_dir / "ca.pem").read_bytes() == original

    pki.init_ca(ca_dir, "other.org", overwrite=True)
    assert pki.CertificateAuthority.load(ca_dir).trust_domain == "other.org"


@pytest.mark.parametrize(
    "trust_domain", ["", "Example.org", "exa mple.org", "a/b", "spiffe://x", "x\n", "é.org"]
)
def test_init_ca_refuses_bad_trust_domain(tmp_path: Path, trust_domain: str) -> None:
    with pytest.raises(ConfigError, match="trust domain"):
        pki.init_ca(tmp_path, trust_domain)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["", "ca", "CA", "a/b", "..", ".", "x y", "alpha\n", "../x"])
def test_issue_refuses_bad_names(ca_dir: Path, name: str) -> None:
    with pytest.raises(ConfigError):
        pki.issue(ca_dir, name)
    assert sorted(os.listdir(ca_dir)) == ["ca.key", "ca.pem"]


def test_issue_without_ca_is_a_one_line_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        pki.issue(tmp_path, "alpha")
    assert caught.value.message == f"CA certificate file {tmp_path / 'ca.pem'}: not found"
    assert "\n" not in str(caught.value)


def test_issue_svid_refuses_ids_outside_the_trust_domain(ca: pki.CertificateAuthority) -> None:
    with pytest.raises(ConfigError) as caught:
        ca.issue_svid("spiffe://other.org/agent/alpha")
    assert caught.value.message == (
        "spiffe://other.org/agent/alpha is outside trust domain example.org"
    )
    for malformed in ["spiffe://example.org", "https://example.org/a", "spiffe://example.org/a/.."]:
        with pytest.raises(ConfigError, match="not a well-formed SPIFFE ID"):
            ca.issue_svid(malformed)
    with pytest.raises(ConfigError, match="lifetime must be positive"):
        ca.issue_svid(ALPHA, valid_for=timedelta(0))


def test_mint_two_uris_is_refused_as_identity(ca: pki.CertificateAuthority) -> None:
    cert_pem, _ = ca.mint(uris=[ALPHA, "spiffe://example.org/agent/beta"])
    with pytest.raises(Unauthenticated, match="found 2"):
        spiffe_id_from_pem(cert_pem)


def test_mint_without_san_omits_the_extension(ca: pki.CertificateAuthority) -> None:
    cert_pem, _ = ca.mint(uris=[])
    with pytest.raises(x509.ExtensionNotFound):
        _load(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    with pytest.raises(Unauthenticated, match="no subject alternative name"):
        spiffe_id_from_pem(cert_pem)


def test_mint_dns_only_has_no_identity(ca: pki.CertificateAuthority) -> None:
    cert_pem, _ = ca.mint(uris=[], dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    with pytest.raises(Unauthenticated, match="found 0"):
        spiffe_id_from_pem(cert_pem)


def test_mint_takes_an_exact_validity_window(ca: pki.CertificateAuthority) -> None:
    start, end = datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 2, tzinfo=UTC)
    cert = _load(ca.mint(uris=[ALPHA], not_before=start, not_after=end)[0])
    assert (cert.not_valid_before_utc, cert.not_valid_after_utc) == (start, end)
    cert.verify_directly_issued_by(ca.certificate)


def test_mint_refuses_a_bad_ip_address(ca: pki.CertificateAuthority) -> None:
    with pytest.raises(ConfigError, match="not an IP address: 'localhost'"):
        ca.mint(uris=[ALPHA], ip_addresses=["localhost"])


def test_load_round_trips(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    ca.save(tmp_path)
    loaded = pki.CertificateAuthority.load(tmp_path)

    assert loaded.trust_domain == "example.org"
    assert loaded.certificate == ca.certificate
    assert loaded.certificate_pem() == (tmp_path / "ca.pem").read_bytes()
    assert loaded.key.private_numbers() == ca.key.private_numbers()
    _load(loaded.issue_svid(ALPHA)[0]).verify_directly_issued_by(ca.certificate)


def test_load_refuses_a_key_of_another_ca(tmp_path: Path, ca: pki.CertificateAuthority) -> None:
    ca.save(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    pki.CertificateAuthority.create("example.org").save(other)
    os.replace(other / "ca.key", tmp_path / "ca.key")
    with pytest.raises(ConfigError) as caught:
        pki.CertificateAuthority.load(tmp_path)
    assert caught.value.message == (
        f"CA key file {tmp_path / 'ca.key'}: does not match {tmp_path / 'ca.pem'}"
    )


def test_load_pem_file_reports_file_and_problem(tmp_path: Path) -> None:
    text = tmp_path / "cert.pem"
    text.write_text("hello")
    with pytest.raises(ConfigError) as caught:
        load_pem_file(text, "peer certificate")
    assert caught.value.message == f"peer certificate file {text}: not PEM"
    with pytest.raises(ConfigError, match=r"^CONFIG_INVALID: trust bundle file .*: unreadable"):
        load_pem_file(tmp_path, "trust bundle")


def test_key_files_are_never_visible_with_wider_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: dict[str, int] = {}
    renamed: dict[str, int] = {}
    real_open, real_replace = os.open, os.replace

    def recording_open(path: Path, flags: int, mode: int = 0o777) -> int:
        # Temp names are ".<final name>.<random>.tmp". Reads (the CA's files) create nothing.
        if flags & os.O_CREAT:
            created[Path(path).name.removeprefix(".").rsplit(".", 2)[0]] = mode
        return real_open(path, flags, mode)

    def recording_replace(src: Path, dst: Path) -> None:
        renamed[Path(dst).name] = _mode(Path(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "replace", recording_replace)
    old_umask = os.umask(0)
    try:
        pki.init_ca(tmp_path, "example.org")
        pki.issue(tmp_path, "alpha")
    finally:
        os.umask(old_umask)
    expected = {"ca.key": 0o600, "ca.pem": 0o644, "alpha.key": 0o600, "alpha.pem": 0o644}
    assert created == expected
    assert renamed == expected


@pytest.fixture
def alpha_server(ca_dir: Path) -> Iterator[int]:
    identity = pki.issue(ca_dir, "alpha")
    credentials = grpc.ssl_server_credentials(
        [(identity.key_path.read_bytes(), identity.cert_path.read_bytes())],
        root_certificates=(ca_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("[::]:0", credentials)
    server.start()
    yield port
    server.stop(grace=None)


def _check_health(ca_dir: Path, port: int, expected_server: str) -> health_pb2.HealthCheckResponse:
    client = pki.issue(ca_dir, "beta")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(ca_dir / "ca.pem").read_bytes(),
        private_key=client.key_path.read_bytes(),
        certificate_chain=client.cert_path.read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", svid_dns_name(expected_server))]
    with grpc.secure_channel(f"localhost:{port}", credentials, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response: health_pb2.HealthCheckResponse = stub.Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return response


def test_svids_complete_an_mtls_handshake(ca_dir: Path, alpha_server: int) -> None:
    response = _check_health(ca_dir, alpha_server, ALPHA)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_handshake_fails_when_server_is_not_the_expected_agent(
    ca_dir: Path, alpha_server: int
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _check_health(ca_dir, alpha_server, "spiffe://example.org/agent/gamma")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_loopback_sans_only_when_asked(ca_dir: Path) -> None:
    plain = _load(pki.issue(ca_dir, "alpha").cert_path.read_bytes())
    loop = _load(pki.issue(ca_dir, "beta", loopback_sans=True).cert_path.read_bytes())
    for cert, dns, ips in (
        (plain, [svid_dns_name(ALPHA)], []),
        (
            loop,
            [svid_dns_name("spiffe://example.org/agent/beta"), "localhost"],
            [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")],
        ),
    ):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == dns
        assert san.get_values_for_type(x509.IPAddress) == ips


@pytest.mark.parametrize(
    "wildcard",
    [
        "*.svid.a2agw.invalid",
        "*",
        "*.a2agw.invalid",
        "id-*.svid.a2agw.invalid",
        "a.*.svid.a2agw.invalid",
        "*.example.org",
    ],
)
def test_the_dev_ca_never_signs_a_wildcard(ca: pki.CertificateAuthority, wildcard: str) -> None:
    with pytest.raises(ConfigError, match="wildcard DNS names are never issued"):
        ca.mint(uris=[ALPHA], dns_names=[svid_dns_name(ALPHA), wildcard])


def test_the_dev_ca_carries_critical_name_constraints(ca: pki.CertificateAuthority) -> None:
    ext = ca.certificate.extensions.get_extension_for_class(x509.NameConstraints)
    assert ext.critical is True
    assert ext.value.excluded_subtrees is None
    # DNS subtrees only: BoringSSL refuses every IP SAN under an IP subtree
    # (tests/devtools/test_pki_extra_names.py).
    assert list(ext.value.permitted_subtrees or []) == [
        x509.DNSName("svid.a2agw.invalid"),
        x509.DNSName("localhost"),
    ]


@pytest.mark.slow
def test_pki_issue_cli_adds_loopback_sans_only_with_the_flag(tmp_path: Path) -> None:

    directory = tmp_path / "pki"
    for args in (
        ["pki", "init", "--dir", str(directory), "--trust-domain", "example.org"],
        ["pki", "issue", "alpha", "--dir", str(directory)],
        ["pki", "issue", "beta", "--dir", str(directory), "--loopback-sans"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    for name, expected in (("alpha", []), ("beta", ["localhost"])):
        cert = _load((directory / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName)[1:] == expected
        assert bool(san.get_values_for_type(x509.IPAddress)) == bool(expected)


def _server_with(ca_dir: Path, cert_pem: bytes, key_pem: bytes) -> tuple[grpc.Server, int]:
    credentials = grpc.ssl_server_credentials(
        [(key_pem, cert_pem)],
        root_certificates=(ca_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


def _health_via(ca_dir: Path, port: int, name: str) -> health_pb2.HealthCheckResponse:
    client = pki.issue(ca_dir, "beta")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(ca_dir / "ca.pem").read_bytes(),
        private_key=client.key_path.read_bytes(),
        certificate_chain=client.cert_path.read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", name)]
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        reply: health_pb2.HealthCheckResponse = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return reply


@pytest.mark.parametrize(
    "name", ["evil.example.com", "svid.a2agw.invalid.evil.example", svid_dns_name(ALPHA)]
)
def test_handshake_enforces_the_ca_name_constraints(ca_dir: Path, name: str) -> None:
    # A certificate the CA key signed behind the issuing code's back for a name
    # outside the permitted subtrees is refused by the client's TLS stack, even
    # when the client asks for exactly that name; an in-bounds name still works.
    ca = pki.CertificateAuthority.load(ca_dir)
    cert_pem, key_pem = ca.mint(uris=[ALPHA], dns_names=[name])
    server, port = _server_with(ca_dir, cert_pem, key_pem)
    try:
        if name.endswith(".svid.a2agw.invalid"):
            reply = _health_via(ca_dir, port, name)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        else:
            with pytest.raises(grpc.RpcError) as caught:
                _health_via(ca_dir, port, name)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)
