"""Who a peer is: exactly one SPIFFE ID, taken from a verified X.509 certificate.

Only the certificate the TLS stack verified counts. Anything a caller writes
about itself (metadata, payload) is never consulted.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

from cryptography import x509
from pydantic import AfterValidator

from gateway.errors import Unauthenticated

_TRUST_DOMAIN = r"[a-z0-9._-]+"
_PATH_SEGMENT = r"[A-Za-z0-9._-]+"
_SPIFFE_ID = re.compile(rf"spiffe://({_TRUST_DOMAIN})((?:/{_PATH_SEGMENT})+)")

SVID_DNS_SUFFIX = "svid.a2agw.invalid"
"""Parent domain of the identity-binding DNS name (see ``svid_dns_name``)."""


def is_spiffe_id(value: str) -> bool:
    """True if ``value`` is a well-formed SPIFFE ID with a non-empty path."""
    if not _SPIFFE_ID.fullmatch(value):
        return False
    segments = value.split("/")[3:]
    return all(segment not in (".", "..") for segment in segments)


def _checked_spiffe_id(value: str) -> str:
    if not is_spiffe_id(value):
        raise ValueError(f"{value!r} is not a SPIFFE ID (spiffe://trust-domain/path)")
    return value


SpiffeId = Annotated[str, AfterValidator(_checked_spiffe_id)]
"""A pydantic field type: a well-formed SPIFFE ID."""


def trust_domain_of(spiffe_id: str) -> str:
    """The trust domain of a well-formed SPIFFE ID."""
    match = _SPIFFE_ID.fullmatch(spiffe_id)
    if match is None:
        raise ValueError(f"not a SPIFFE ID: {spiffe_id!r}")
    return match.group(1)


def svid_dns_name(spiffe_id: str) -> str:
    """A DNS name bound to one SPIFFE ID, carried as a DNS SAN next to the URI SAN.

    gRPC Python cannot show a client the server's certificate, but it does
    verify the server's name. Asking for this name (via
    ``grpc.ssl_target_name_override``) makes the TLS handshake itself prove the
    server holds a CA-signed certificate for the expected SPIFFE ID.
    """
    digest = hashlib.sha256(spiffe_id.encode()).hexdigest()[:32]
    return f"id-{digest}.{SVID_DNS_SUFFIX}"


@dataclass(frozen=True, slots=True)
class PeerCertificate:
    """What a verified peer certificate says: its one SPIFFE ID and its validity.

    The TLS stack checks the validity once, at the handshake; a connection
    (a gRPC channel, an HTTPS keep-alive) may outlive the certificate, so the
    decision path checks it again at every call.

    Attributes:
        spiffe_id: The certificate's one SPIFFE ID.
        not_before: Epoch seconds from which it is valid.
        not_after: Epoch seconds after which it is not.
    """

    spiffe_id: str
    not_before: float
    not_after: float


@lru_cache(maxsize=1024)
def peer_certificate(pem: bytes) -> PeerCertificate:
    """The SPIFFE ID (see :func:`spiffe_id_from_pem`) and validity of a PEM certificate.

    Raises:
        Unauthenticated: as :func:`spiffe_id_from_pem`.
    """
    spiffe_id = spiffe_id_from_pem(pem)
    certificate = x509.load_pem_x509_certificate(pem)  # parsed cleanly just above
    return PeerCertificate(
        spiffe_id,
        certificate.not_valid_before_utc.timestamp(),
        certificate.not_valid_after_utc.timestamp(),
    )


@lru_cache(maxsize=1024)
def spiffe_id_from_pem(pem: bytes) -> str:
    """The single SPIFFE ID in a PEM certificate's URI SANs.

    Every extension is read, not only the SAN: ``cryptography`` parses them all
    at once, and a certificate the gateway cannot read completely is refused
    rather than half-trusted.

    Raises:
        Unauthenticated: the certificate or any of its extensions cannot be
            parsed, or its URI SANs do not hold exactly one well-formed SPIFFE
            ID. Messages are fixed texts: nothing of the certificate or of the
            parser's own error reaches the caller.
    """
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError as err:
        raise Unauthenticated("peer certificate could not be parsed") from err
    try:
        extensions = certificate.extensions
    except (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType) as err:
        # A CA-signed certificate with a malformed non-critical extension (a
        # truncated SCT list or AIA, a URI SAN that is not IA5) passes the TLS
        # handshake but cannot be read here.
        raise Unauthenticated(
            "peer certificate has an extension that could not be parsed",
            detail=f"unreadable certificate extension ({type(err).__name__})",
        ) from err
    try:
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as err:
        raise Unauthenticated("peer certificate has no subject alternative name") from err
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    spiffe_ids = [uri for uri in uris if uri.startswith("spiffe://")]
    if len(uris) != 1 or len(spiffe_ids) != 1:
        raise Unauthenticated(
            f"peer certificate must carry exactly one URI SAN with a SPIFFE ID, found {len(uris)}"
        )
    if not is_spiffe_id(spiffe_ids[0]):
        raise Unauthenticated("peer certificate URI SAN is not a well-formed SPIFFE ID")
    return spiffe_ids[0]
