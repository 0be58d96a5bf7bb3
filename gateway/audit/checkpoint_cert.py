"""The certificate a checkpoint line carries: is it the agent's, from the trusted CA?

After a rotation (``pki issue --force``) the certificate that signed older
checkpoints is gone from disk; each line therefore carries it (see
:mod:`gateway.audit.checkpoint`). Such a certificate is believed only if it
is the one the line's ``cert_sha256`` names, was issued directly by a CA of
the trust bundle the agent itself uses (``[tls] ca``), names the agent's
SPIFFE ID in its one URI SAN, and was valid when the line says it was
signed. Whether its key made the signature is checked by the caller.

What this does not catch: a checkpoint signed, with a backdated time, by
whoever holds a rotated-away (or expired) key of the agent. Revocation is
outside the dev PKI.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from datetime import UTC, datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from gateway.audit.checkpoint import Checkpoint
from gateway.errors import ConfigError, Unauthenticated
from policies.identity import spiffe_id_from_pem


def load_trust_bundle(pem: bytes, source: str) -> list[x509.Certificate]:
    """Every certificate of a PEM trust bundle.

    Raises:
        ConfigError: ``pem`` holds no certificate.
    """
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise ConfigError(f"{source}: no readable certificate") from err


def carried_certificate(
    checkpoint: Checkpoint, agent: str, bundle: list[x509.Certificate]
) -> tuple[bytes | None, str]:
    """``(cert_pem, "")`` if the line's own certificate may check its signature, else
    ``(None, why)``."""
    try:
        der = base64.b64decode(checkpoint.cert, validate=True)
        certificate = x509.load_der_x509_certificate(der)
    except (ValueError, binascii.Error):
        return None, "its certificate is unreadable"
    if hashlib.sha256(der).hexdigest() != checkpoint.cert_sha256:
        return None, "it carries another certificate than cert_sha256 names"
    if not any(_issued_by(certificate, ca) for ca in bundle):
        return None, "its certificate is not issued by the trusted CA"
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    try:
        holder = spiffe_id_from_pem(pem)
    except Unauthenticated:
        return None, "its certificate names no single SPIFFE ID"
    if holder != agent:
        return None, f"its certificate names {holder}, not {agent}"
    signed_at = datetime.fromtimestamp(checkpoint.time_unix_ms / 1000, UTC)
    if not certificate.not_valid_before_utc <= signed_at <= certificate.not_valid_after_utc:
        return None, "signed outside its certificate's validity"
    return pem, ""


def _issued_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
