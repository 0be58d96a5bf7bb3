"""mTLS material and the gRPC credentials/options built from it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import grpc
from cryptography import x509

from gateway.errors import ConfigError, PeerUnavailable, Unauthenticated
from gateway.local.regular_files import read_regular_file
from policies.grants import MAX_PAYLOAD_CEILING
from policies.identity import spiffe_id_from_pem, svid_dns_name, trust_domain_of

MESSAGE_CEILING = MAX_PAYLOAD_CEILING + 64 * 1024
"""Server-wide gRPC message limit: larger messages are refused by gRPC core,
before any Python code runs. It leaves room for the envelope around the
largest payload a grant may allow."""


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """PEM bytes of one agent's trust root, certificate and key.

    Attributes:
        ca_pem: Trust root(s) for verifying peers (every bundle, concatenated).
        cert_pem: This agent's certificate chain (an X.509-SVID).
        key_pem: This agent's private key. Never logged.
        bundles: Trust domain and PEM roots of each trust bundle, own domain
            first, when the roots are known per trust domain (the Workload
            API); empty for a CA file, whose roots serve every peer.
    """

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    bundles: tuple[tuple[str, bytes], ...] = ()

    def __repr__(self) -> str:
        return "TlsMaterial(<redacted>)"

    @classmethod
    def from_files(cls, ca: Path, cert: Path, key: Path) -> TlsMaterial:
        """Read the three PEM files; raises ConfigError naming the one that failed."""
        return cls(
            ca_pem=load_pem_file(ca, "CA certificate"),
            cert_pem=load_pem_file(cert, "certificate"),
            key_pem=load_pem_file(key, "private key"),
        )

    def spiffe_id(self) -> str:
        """The SPIFFE ID in this agent's own certificate.

        Raises:
            ConfigError: the certificate does not hold exactly one SPIFFE ID, or
                it carries a wildcard DNS name (see :func:`refuse_wildcard_dns`).
        """
        try:
            spiffe_id = spiffe_id_from_pem(self.cert_pem)
        except Unauthenticated as err:
            raise ConfigError(f"own certificate: {err.message}") from err
        refuse_wildcard_dns(self.cert_pem)
        return spiffe_id

    def not_after(self) -> datetime:
        """When this agent's own certificate expires (UTC).

        Raises:
            ConfigError: the certificate cannot be parsed.
        """
        try:
            certificate = x509.load_pem_x509_certificate(self.cert_pem)
        except ValueError as err:
            raise ConfigError("own certificate: cannot be parsed") from err
        return certificate.not_valid_after_utc

    def roots_for(self, trust_domain: str) -> bytes | None:
        """The roots that may vouch for an identity of ``trust_domain``.

        With per-domain bundles only that domain's bundle counts (None if
        there is none: no certificate of that domain can be trusted); a CA
        file's roots count for every domain.
        """
        if not self.bundles:
            return self.ca_pem
        return dict(self.bundles).get(trust_domain)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that require and verify a client certificate."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.ca_pem,
            require_client_auth=True,
        )

    def channel_credentials(self, peer_id: str | None = None) -> grpc.ChannelCredentials:
        """Client credentials presenting this agent's certificate.

        With ``peer_id`` the server is verified against the bundle of the
        peer's own trust domain only, so a federated domain's CA cannot
        answer for an agent of another domain.

        Raises:
            PeerUnavailable: there is no trust bundle for the peer's trust domain.
        """
        roots = self.ca_pem
        if peer_id is not None:
            domain = trust_domain_of(peer_id)
            found = self.roots_for(domain)
            if found is None:
                raise PeerUnavailable(
                    f"no trust bundle for trust domain {domain}: the Workload API delivers "
                    "none (federate with it to call its agents)"
                )
            roots = found
        return grpc.ssl_channel_credentials(
            root_certificates=roots,
            private_key=self.key_pem,
            certificate_chain=self.cert_pem,
        )


HANDSHAKE_SECONDS = 10.0
"""How long a connection to the gRPC port has to finish its TLS and HTTP/2 handshake
(gRPC's own default is 120 s: long enough for silent connections to pile up)."""


def server_options() -> list[tuple[str, int]]:
    """gRPC server options: the message ceiling in both directions, the handshake deadline."""
    return [
        ("grpc.max_receive_message_length", MESSAGE_CEILING),
        ("grpc.max_send_message_length", MESSAGE_CEILING),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_SECONDS * 1000)),
    ]


def channel_options(expected_peer_id: str) -> list[tuple[str, str | int]]:
    """Client options that bind the TLS handshake to ``expected_peer_id``.

    The server must present a certificate carrying ``svid_dns_name`` of the
    expected SPIFFE ID, so a different agent of the same CA is refused. A server
    whose certificate carries only its SPIFFE ID (no derived DNS name) is
    reached through ``gateway.client.spiffe_relay`` instead
    (:func:`relay_channel_options`).
    """
    return [
        ("grpc.ssl_target_name_override", svid_dns_name(expected_peer_id)),
        ("grpc.default_authority", svid_dns_name(expected_peer_id)),
        ("grpc.max_receive_message_length", MESSAGE_CEILING),
        ("grpc.max_send_message_length", MESSAGE_CEILING),
    ]


def relay_channel_options(expected_peer_id: str) -> list[tuple[str, str | int]]:
    """Options of a plaintext channel to ``gateway.client.spiffe_relay``, which pins
    ``expected_peer_id`` by its URI SAN; the authority is the same as over TLS."""
    return [
        ("grpc.default_authority", svid_dns_name(expected_peer_id)),
        ("grpc.max_receive_message_length", MESSAGE_CEILING),
        ("grpc.max_send_message_length", MESSAGE_CEILING),
    ]


def refuse_wildcard_dns(cert_pem: bytes) -> None:
    """Refuse an own certificate with a wildcard DNS SAN.

    Clients bind a server to one SPIFFE ID through the DNS name derived from
    it (``svid_dns_name``). A wildcard such as ``*.svid.a2agw.invalid`` would
    answer for every agent of the trust domain, so an agent never serves with
    one: the CA that issued it does not meet the gateway's requirements.

    Raises:
        ConfigError: the certificate carries a DNS SAN with a ``*``.
    """
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return
    except ValueError as err:
        raise ConfigError("own certificate: cannot be parsed") from err
    wildcards = [name for name in san.get_values_for_type(x509.DNSName) if "*" in name]
    if wildcards:
        raise ConfigError(
            f"own certificate carries wildcard DNS name(s) {', '.join(map(repr, wildcards))}: "
            "a wildcard would let this certificate answer for other agents; "
            "issue one without wildcards"
        )


def load_pem_file(path: Path, what: str) -> bytes:
    """The bytes of a PEM file; ``what`` names it in errors (e.g. "CA certificate").

    Raises:
        ConfigError: the file is missing, unreadable, or holds no PEM block.
    """
    try:
        data = read_regular_file(path)
    except FileNotFoundError as err:
        raise ConfigError(f"{what} file {path}: not found") from err
    except OSError as err:
        raise ConfigError(f"{what} file {path}: unreadable ({err.strerror})") from err
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} file {path}: not PEM")
    return data
