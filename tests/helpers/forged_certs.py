"""CA-signed client certificates whose extensions hold arbitrary DER (nothing here is a test).

``cryptography`` encodes an ``UnrecognizedExtension`` as the raw bytes it is
given, whatever its OID, so a known extension (SAN, AIA, SCT list, ...) can be
given a truncated or garbled value and still be signed by the session CA, the
way a careless or hostile CA could sign it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from gateway.devtools.pki import CertificateAuthority
from gateway.transport.tls import TlsMaterial

SAN = "2.5.29.17"
AIA = "1.3.6.1.5.5.7.1.1"
SCT_LIST = "1.3.6.1.4.1.11129.2.4.2"

EXTENSION_OIDS: dict[str, str] = {
    "subject_alt_name": SAN,
    "authority_info_access": AIA,
    "sct_list": SCT_LIST,
    "basic_constraints": "2.5.29.19",
    "key_usage": "2.5.29.15",
    "extended_key_usage": "2.5.29.37",
    "subject_key_identifier": "2.5.29.14",
    "authority_key_identifier": "2.5.29.35",
    "crl_distribution_points": "2.5.29.31",
    "freshest_crl": "2.5.29.46",
    "certificate_policies": "2.5.29.32",
    "policy_constraints": "2.5.29.36",
    "policy_mappings": "2.5.29.33",
    "inhibit_any_policy": "2.5.29.54",
    "name_constraints": "2.5.29.30",
    "issuer_alt_name": "2.5.29.18",
    "subject_directory_attributes": "2.5.29.9",
    "subject_info_access": "1.3.6.1.5.5.7.1.11",
    "tls_feature": "1.3.6.1.5.5.7.1.24",
    "ocsp_no_check": "1.3.6.1.5.5.7.48.1.5",
    "precert_poison": "1.3.6.1.4.1.11129.2.4.3",
    "ms_certificate_template": "1.3.6.1.4.1.311.21.7",
    "private_unknown": "1.3.6.1.4.1.55555.1",
}
"""Every extension the fuzz tests garble, by name (known ones and one nobody knows)."""

BOB = b"spiffe://example.org/agent/bob"


def der_length(size: int) -> bytes:
    """A DER length field."""
    if size < 0x80:
        return bytes([size])
    body = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def tlv(tag: int, body: bytes) -> bytes:
    """One DER element."""
    return bytes([tag]) + der_length(len(body)) + body


def san_with_uris(*uris: bytes) -> bytes:
    """A SubjectAltName value holding these URI bytes verbatim (no charset check)."""
    return tlv(0x30, b"".join(tlv(0x86, uri) for uri in uris))


WELL_FORMED: dict[str, bytes] = {
    SAN: san_with_uris(BOB),
    AIA: tlv(
        0x30, tlv(0x30, tlv(0x06, bytes.fromhex("2b06010505073001")) + tlv(0x86, b"http://o"))
    ),
    SCT_LIST: tlv(0x04, bytes.fromhex("0000")),
}
"""Valid values to truncate or mutate (others start from random bytes)."""


@dataclass(frozen=True, slots=True)
class RawExtension:
    """One extension to put into a certificate exactly as given."""

    oid: str
    value: bytes
    critical: bool = False


def mint_raw(
    ca: CertificateAuthority, extensions: Sequence[RawExtension], *, usual: bool = True
) -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) signed by ``ca`` with ``extensions`` verbatim.

    With ``usual`` the leaf also gets the dev CA's basic constraints, key usage
    and EKU (each left out when ``extensions`` carries its own value).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "forged")]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
    )
    given = {ext.oid for ext in extensions}
    if usual:
        for ext, critical in _usual_extensions():
            if ext.oid.dotted_string not in given:
                builder = builder.add_extension(ext, critical=critical)
    for raw in extensions:
        value = x509.UnrecognizedExtension(ObjectIdentifier(raw.oid), raw.value)
        builder = builder.add_extension(value, critical=raw.critical)
    certificate = builder.sign(ca.key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def material_raw(ca: CertificateAuthority, extensions: Sequence[RawExtension]) -> TlsMaterial:
    """TLS material (trusting ``ca``) presenting a ``mint_raw`` certificate."""
    cert, key = mint_raw(ca, extensions)
    return TlsMaterial(ca_pem=ca.certificate_pem(), cert_pem=cert, key_pem=key)


def _usual_extensions() -> list[tuple[x509.ExtensionType, bool]]:
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=True,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    return [(x509.BasicConstraints(ca=False, path_length=None), True), (usage, True), (eku, False)]


MALFORMED_EXAMPLES: dict[str, list[RawExtension]] = {
    "truncated SCT list": [
        RawExtension(SAN, WELL_FORMED[SAN]),
        RawExtension(SCT_LIST, WELL_FORMED[SCT_LIST][:-1]),
    ],
    "truncated AIA": [
        RawExtension(SAN, WELL_FORMED[SAN]),
        RawExtension(AIA, WELL_FORMED[AIA][:-3]),
    ],
    "URI SAN with non-ASCII bytes": [
        RawExtension(SAN, san_with_uris(b"spiffe://example.org/agent/b\xffb"))
    ],
    "URI SAN with UTF-8 bytes": [
        RawExtension(SAN, san_with_uris(b"spiffe://example.org/agent/b\xc3\xa9b"))
    ],
    "truncated SAN": [RawExtension(SAN, WELL_FORMED[SAN][:-4])],
    "garbage key usage": [
        RawExtension(SAN, WELL_FORMED[SAN]),
        RawExtension("2.5.29.15", b"\x03\x09"),
    ],
    "garbage certificate policies": [
        RawExtension(SAN, WELL_FORMED[SAN]),
        RawExtension("2.5.29.32", b"\x30\x03\x30\x81"),
    ],
}
"""Named malformed certificates run against a real agent (the fuzz test covers the rest)."""


REACH_THE_GATEWAY = (
    "truncated SCT list",
    "truncated AIA",
    "URI SAN with non-ASCII bytes",
    "URI SAN with UTF-8 bytes",
)


PARSER_WORDS = ("ValueError", "asn1", "ParseError", "Traceback", "Unexpected")
