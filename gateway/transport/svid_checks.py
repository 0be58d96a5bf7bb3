"""What an agent requires of its own certificate, and of a peer's under several trust domains.

Used by :class:`gateway.transport.live_tls.LiveTls` for every set it is offered
(files at start and on reload, each Workload API update). Messages name the
problem and the fix, never certificate or key content.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from gateway.errors import ConfigError
from gateway.transport.tls import TlsMaterial
from policies.identity import svid_dns_name, trust_domain_of

_PUBLIC = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

DROPPED_ROOTS_KEPT = 64
"""How many roots dropped from the trust bundle an agent remembers (``dropped_roots``)."""


@dataclass(frozen=True, slots=True)
class CertificateFacts:
    """What the agent may say about its own certificate (no key, no PEM).

    Attributes:
        serial: Its serial number.
        not_before: Start of its validity.
        not_after: End of its validity.
        derived_name: It carries the DNS name derived from the agent's SPIFFE ID
            (``svid_dns_name``). Optional: clients that cannot pin the URI SAN
            (gRPC clients that verify only a host name) need it.
    """

    serial: int
    not_before: datetime
    not_after: datetime
    derived_name: bool


def check_material(material: TlsMaterial, agent_id: str, now: datetime) -> CertificateFacts:
    """Everything an agent requires of its own TLS material before using it.

    The DNS name derived from ``agent_id`` is not required: an SVID with only
    its URI SAN (a SPIRE registration without ``-dns``) serves every binding.

    Raises:
        ConfigError: a file does not parse, the SPIFFE ID is not ``agent_id`` or
            a DNS name is a wildcard, the certificate is expired or not yet
            valid, it was not issued by the CA file (the agent's own trust
            bundle), or the key is not its key.
    """
    spiffe_id = material.spiffe_id()  # also refuses wildcard DNS names
    if spiffe_id != agent_id:
        raise ConfigError(f"agent id {agent_id} does not match its certificate ({spiffe_id})")
    own_roots = material.roots_for(trust_domain_of(agent_id))
    if own_roots is None:
        raise ConfigError(f"no trust bundle for the agent's own trust domain ({agent_id})")
    try:
        chain = x509.load_pem_x509_certificates(material.cert_pem)
        roots = x509.load_pem_x509_certificates(own_roots)
        key = serialization.load_pem_private_key(material.key_pem, password=None)
    except (ValueError, TypeError) as err:
        # The message names the file kind only: never key or certificate content.
        raise ConfigError("certificate, key or CA file cannot be parsed") from err
    leaf = chain[0]
    if key.public_key().public_bytes(*_PUBLIC) != leaf.public_key().public_bytes(*_PUBLIC):
        raise ConfigError("the private key does not belong to the certificate")
    if now >= leaf.not_valid_after_utc:
        raise ConfigError(f"the certificate expired at {leaf.not_valid_after_utc.isoformat()}")
    if now < leaf.not_valid_before_utc:
        raise ConfigError(
            f"the certificate is not valid before {leaf.not_valid_before_utc.isoformat()}"
        )
    if not issued_within(chain, roots, now):
        raise ConfigError(
            "the certificate was not issued by the configured CA "
            "(its own chain in the certificate file does not lead to it)"
        )
    return CertificateFacts(
        serial=leaf.serial_number,
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        derived_name=carries_svid_dns_name(leaf, agent_id),
    )


def carries_svid_dns_name(leaf: x509.Certificate, agent_id: str) -> bool:
    """True if ``leaf`` carries ``svid_dns_name(agent_id)`` as a DNS SAN."""
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return svid_dns_name(agent_id) in san.get_values_for_type(x509.DNSName)


def issued_within(
    chain: list[x509.Certificate], roots: list[x509.Certificate], now: datetime | None = None
) -> bool:
    """True if ``chain`` (leaf first, then intermediates) leads to one of ``roots``.

    Each certificate must be directly issued by a root or by the next one, which
    must then be a CA (valid at ``now``, if given): the path a peer builds from
    what is presented. Some other certificate in the file that a root issued
    (the CA itself, appended after a foreign leaf) proves nothing about the leaf,
    and a chain that leaves ``roots``' trust domain is not accepted.
    """
    for index, certificate in enumerate(chain):
        if any(_issued_by(certificate, root) for root in roots):
            return True
        following = chain[index + 1] if index + 1 < len(chain) else None
        if following is None or not _is_ca(following, now):
            return False
        if not _issued_by(certificate, following):
            return False
    return False


def _is_ca(certificate: x509.Certificate, now: datetime | None) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    if now is not None and not (
        certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc
    ):
        return False
    return constraints.value.ca


def dropped_roots(before_pem: bytes, after_pem: bytes, dropped_pem: bytes = b"") -> bytes:
    """PEM of the roots ``after_pem`` no longer holds: those of ``before_pem``, and those
    dropped earlier (``dropped_pem``), the latest ``DROPPED_ROOTS_KEPT`` of them.

    A root that comes back into ``after_pem`` is no longer counted as dropped.
    """
    try:
        kept = set(x509.load_pem_x509_certificates(after_pem))
        earlier = x509.load_pem_x509_certificates(dropped_pem) if dropped_pem else []
        gone = x509.load_pem_x509_certificates(before_pem)
    except ValueError:  # checked sets always parse: keep what is known
        return dropped_pem
    dropped: list[x509.Certificate] = []
    for root in [*earlier, *gone]:
        if root not in kept and root not in dropped:
            dropped.append(root)
    return b"".join(
        root.public_bytes(serialization.Encoding.PEM) for root in dropped[-DROPPED_ROOTS_KEPT:]
    )


@lru_cache(maxsize=1024)
def chains_to(cert_pem: bytes, roots_pem: bytes) -> bool:
    """True if the PEM chain ``cert_pem`` leads to a root in ``roots_pem`` (cached).

    Cached per peer certificate and bundle, not worked out per call. gRPC
    shows a server only the client's leaf, so an SVID under an intermediate
    CA does not chain here (refused: fail closed).
    """
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
        roots = x509.load_pem_x509_certificates(roots_pem)
    except ValueError:
        return False
    return issued_within(chain, roots)


def _issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
