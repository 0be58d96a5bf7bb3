"""Helpers for rotation tests: a PKI of the test's own, serials seen on the wire."""

from __future__ import annotations

import socket
import ssl
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.devtools.pki import CertificateAuthority, init_ca, issue
from policies.identity import svid_dns_name
from tests.helpers.agents import TRUST_DOMAIN, Pki, spiffe


def own_pki(base: Path) -> Pki:
    """A CA and alice, bob, carol, only for this test (its files get rewritten)."""
    directory = base / "pki"
    init_ca(directory, TRUST_DOMAIN)
    for name in ("alice", "bob", "carol"):
        issue(directory, name)
    return Pki(dir=directory, ca=CertificateAuthority.load(directory), foreign_dir=directory)


def file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def client_context(pki: Pki, name: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    context.load_cert_chain(str(pki.dir / f"{name}.pem"), str(pki.dir / f"{name}.key"))
    context.set_alpn_protocols(["h2"])
    return context


def served_serial(pki: Pki, address: str, server_id: str, client: str = "bob") -> int:
    """Serial of the certificate a new TLS handshake with ``address`` presents.

    gRPC Python cannot show the server's certificate, so this is a plain TLS
    handshake with a client certificate, as a peer's channel would make.
    """
    host, port = address.rsplit(":", 1)
    context = client_context(pki, client)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=svid_dns_name(server_id)) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def wildcard_pair(ca: CertificateAuthority, name: str) -> tuple[bytes, bytes]:
    """(cert, key) for agent ``name`` with a wildcard DNS SAN (the dev CA never makes one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    san = x509.SubjectAlternativeName(
        [
            x509.UniformResourceIdentifier(spiffe(name)),
            x509.DNSName(svid_dns_name(spiffe(name))),
            x509.DNSName("*.svid.a2agw.invalid"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(san, critical=True)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


class RecordingTlsServer:
    """A TLS listener posing as ``name``: records each client certificate's serial, then hangs up.

    It stands in for a receiving peer so a test can see which client
    certificate an agent's outbound channel presents.
    """

    def __init__(self, pki: Pki, name: str) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(str(pki.dir / f"{name}.pem"), str(pki.dir / f"{name}.key"))
        self._context.load_verify_locations(str(pki.dir / "ca.pem"))
        self._context.verify_mode = ssl.CERT_REQUIRED
        self._context.set_alpn_protocols(["h2"])
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.serials: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                conn.settimeout(5)
                with self._context.wrap_socket(conn, server_side=True) as tls:
                    der = tls.getpeercert(binary_form=True)
                    if der is not None:
                        self.serials.append(x509.load_der_x509_certificate(der).serial_number)
            except (OSError, ssl.SSLError):
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._listener.close()
