"""Our own TLS to a server that must hold one SPIFFE ID, pinned by its URI SAN.

gRPC's TLS stack verifies a server only by a DNS name or an IP address, so a
``grpc.aio`` channel binds a server to a SPIFFE ID through the DNS name derived
from it (``policies.identity.svid_dns_name``), when its certificate carries that
name. Python's ``ssl`` verifies here instead: OpenSSL checks the chain against
the bundle of the expected ID's trust domain only, and then, still inside the
handshake, :class:`PinnedHandshake` requires the leaf's one URI SAN to be the
expected SPIFFE ID (``spiffe_id_from_pem``: exactly one, well formed). A server
holding another identity, or none, fails the handshake with
:class:`WrongServerIdentity` before a byte of any request is written. No host
name is checked: the name a client dials proves nothing of who answers; the
SPIFFE ID does, and no fallback accepts a server without it.

Used for every connection of our own that must reach one identity: the relay
that carries gRPC to a server whose SVID has only its URI SAN
(``gateway.client.spiffe_relay``), the HTTPS connections to JSON-RPC upstreams,
and the probe that says why a channel could not connect
(``gateway.client.handshake``).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.config import TlsFiles, TlsSettings
from gateway.errors import PeerUnavailable, Unauthenticated
from gateway.transport.tls import TlsMaterial
from policies.identity import spiffe_id_from_pem, svid_dns_name, trust_domain_of


class WrongServerIdentity(ssl.SSLCertVerificationError):
    """The server's certificate chains to the bundle but is not the expected SPIFFE ID's.

    Raised inside the TLS handshake, so nothing was sent. The message names both
    IDs (or why the certificate holds none); never certificate content.
    """

    def __init__(self, message: str) -> None:
        # (errno, strerror): TLS wrappers such as anyio read ``strerror``.
        super().__init__(1, message)


class PinnedHandshake(ssl.SSLObject):
    """An ``SSLObject`` whose handshake ends only if the server is :attr:`server_id`.

    Installed as a context's ``sslobject_class`` (one subclass per expected ID,
    made by :func:`pinned_context`), so asyncio's and anyio's TLS, which both
    drive ``do_handshake``, check it on every connection.
    """

    server_id: ClassVar[str] = ""

    def do_handshake(self) -> None:
        """Finish the TLS handshake, then require the expected SPIFFE ID.

        Raises:
            WrongServerIdentity: the verified certificate is for another ID.
        """
        super().do_handshake()
        der = self.getpeercert(binary_form=True)
        require_server_id(der, self.server_id)


def require_server_id(der: bytes | None, expected: str) -> None:
    """Refuse a server certificate (DER, already verified) that is not ``expected``'s.

    Raises:
        WrongServerIdentity: no certificate, none or several URI SANs, or another ID.
    """
    if not der:
        raise WrongServerIdentity(f"the server presented no certificate (expected {expected})")
    pem = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)
    try:
        found = spiffe_id_from_pem(pem)
    except Unauthenticated as err:
        problem = f"server certificate: {err.message} (expected {expected})"
        raise WrongServerIdentity(problem) from err
    if found != expected:
        raise WrongServerIdentity(f"the server is {found}, not {expected}")


def carries_derived_name(der: bytes, spiffe_id: str) -> bool:
    """True if the certificate (DER) carries ``svid_dns_name(spiffe_id)`` as a DNS SAN."""
    try:
        certificate = x509.load_der_x509_certificate(der)
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    return svid_dns_name(spiffe_id) in san.get_values_for_type(x509.DNSName)


def pinned_context(
    tls: TlsMaterial,
    server_id: str,
    files: TlsSettings | None = None,
    *,
    alpn: Sequence[str] = (),
) -> ssl.SSLContext:
    """A client context that presents this agent's certificate and accepts only ``server_id``.

    It trusts only the bundle of ``server_id``'s trust domain and checks no host
    name: :class:`PinnedHandshake` checks the SPIFFE ID instead.

    Args:
        tls: This agent's material (bundles, certificate, key).
        server_id: The SPIFFE ID the server must hold.
        files: The agent's ``[tls]`` settings: with certificate files, Python's
            ssl reads them; otherwise (an SVID in memory) they go through a
            private temporary folder that is removed at once.
        alpn: Protocols to offer (``["h2"]`` for gRPC).

    Raises:
        PeerUnavailable: there is no trust bundle for ``server_id``'s trust domain.
    """
    roots = tls.roots_for(trust_domain_of(server_id))
    if roots is None:
        raise PeerUnavailable(f"no trust bundle for the trust domain of {server_id}")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=roots.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the SPIFFE ID is checked instead (verify_mode stays REQUIRED)
    context.sslobject_class = type("PinnedHandshake", (PinnedHandshake,), {"server_id": server_id})
    if alpn:
        context.set_alpn_protocols(list(alpn))
    _load_own_certificate(context, tls, files)
    return context


def _load_own_certificate(
    context: ssl.SSLContext, tls: TlsMaterial, files: TlsSettings | None
) -> None:
    # Python's ssl loads a client certificate only from files: the agent's
    # configured files, the ones its TlsMaterial was read from; an SVID from
    # the Workload API lives in memory only, so it goes through a private
    # temporary folder that is removed at once.
    if isinstance(files, TlsFiles):
        context.load_cert_chain(files.cert, files.key)
        return
    with tempfile.TemporaryDirectory(prefix="a2agw-svid-") as folder:  # mode 0700
        cert, key = Path(folder) / "svid.pem", Path(folder) / "svid.key"
        cert.write_bytes(tls.cert_pem)
        descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(tls.key_pem)
        context.load_cert_chain(cert, key)
