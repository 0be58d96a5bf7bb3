"""The signature on every push notification: a detached JWS with an unencoded payload.

Each delivery carries the header ``X-A2A-Notification-Signature:
PROTECTED..SIGNATURE``, a JWS in compact form (RFC 7515) whose payload is the
request body itself, detached and not base64url-encoded (RFC 7797:
``"b64": false``, listed in ``"crit"``). The signing input is the ASCII of
PROTECTED, a dot, then the body's bytes as sent. The protected header:

- ``alg``: ``ES256`` (P-256 SVID), ``ES384``/``ES512``, or ``RS256`` (RSA);
- ``kid``: the agent's SPIFFE ID;
- ``x5c``: the agent's SVID chain, leaf first (base64 DER), so a receiver
  that trusts the agent's trust domain CA checks who signed it;
- ``iat``: when it was signed (Unix seconds; each attempt signs anew);
- ``jti``: the notification's id, the same on every attempt (deduplicate on it);
- ``aud``: the webhook URL exactly as registered (a notification meant for one
  webhook does not verify as meant for another).

The key is the agent's SVID key in force at the attempt (after a rotation
the next attempt carries the new chain). :func:`verify_notification` is the
receiver's side, in Python; docs/a2a-push.md shows it in a few lines.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.verification import PolicyBuilder, Store

from gateway.errors import ConfigError, Unauthenticated
from gateway.transport.tls import TlsMaterial
from policies.identity import spiffe_id_from_pem

SIGNATURE_HEADER = "X-A2A-Notification-Signature"
"""The request header carrying the detached JWS."""
ALGORITHMS = ("ES256", "ES384", "ES512", "RS256")
"""What this agent signs with (by its key), and what a receiver should accept."""
_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


class NotificationSigner:
    """Signs bodies with the SVID key of ``material()`` (the key and chain are read
    again when the material changes: certificate rotation)."""

    def __init__(self, agent_id: str, material: Callable[[], TlsMaterial]) -> None:
        self._agent_id = agent_id
        self._material = material
        self._for: TlsMaterial | None = None
        self._key: Any = None
        self._header: dict[str, Any] = {}

    def sign(self, body: bytes, *, url: str, notification_id: str) -> str:
        """The header value for ``body`` sent to ``url`` (``PROTECTED..SIGNATURE``).

        Raises:
            ConfigError: the agent's key is neither EC (P-256/384/521) nor RSA.
        """
        material = self._material()
        if material is not self._for:
            self._load(material)
        header = {
            **self._header,
            "typ": None,  # PyJWT would write "JWT"; this is no JWT
            "iat": int(time.time()),
            "jti": notification_id,
            "aud": url,
        }
        return jwt.api_jws.encode(
            body, self._key, algorithm=header["alg"], headers=header, is_payload_detached=True
        )

    def _load(self, material: TlsMaterial) -> None:
        key = serialization.load_pem_private_key(material.key_pem, password=None)
        chain = x509.load_pem_x509_certificates(material.cert_pem)
        self._key, self._for = key, material
        self._header = {
            "alg": _algorithm(key),
            "kid": self._agent_id,
            "x5c": [
                base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
                for cert in chain
            ],
        }


def _algorithm(key: Any) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _EC_ALGORITHMS:
        return _EC_ALGORITHMS[key.curve.name]
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    raise ConfigError("the agent's key is neither P-256/384/521 nor RSA: it cannot sign")


def verify_notification(
    body: bytes, signature: str, ca_pem: bytes, expected_id: str, *, url: str | None = None
) -> dict[str, Any]:
    """Check that ``body`` was signed by the holder of ``expected_id``'s SVID; its header.

    Args:
        body: The request body, exactly as received.
        signature: The ``X-A2A-Notification-Signature`` header.
        ca_pem: The CA certificates of the agent's trust domain.
        expected_id: The SPIFFE ID of the agent the notifications come from.
        url: The webhook URL as registered; when given, ``aud`` must be it.

    Raises:
        Unauthenticated: the signature, chain, identity or audience does not hold.
    """
    try:
        header = jwt.get_unverified_header(signature)
        chain = [x509.load_der_x509_certificate(base64.b64decode(c)) for c in header["x5c"]]
    except (jwt.PyJWTError, ValueError, KeyError, TypeError) as err:
        raise Unauthenticated("the notification's signature header cannot be read") from err
    if not chain:
        raise Unauthenticated("the notification's signature carries no certificate chain")
    try:
        verifier = PolicyBuilder().store(Store(x509.load_pem_x509_certificates(ca_pem)))
        verifier.build_client_verifier().verify(chain[0], chain[1:])
    except Exception as err:
        raise Unauthenticated("the notification's certificate chain does not verify") from err
    if spiffe_id_from_pem(chain[0].public_bytes(serialization.Encoding.PEM)) != expected_id:
        raise Unauthenticated("the notification was signed by another SPIFFE ID")
    key = chain[0].public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise Unauthenticated("the notification was signed with a key of an unknown kind")
    try:
        jwt.api_jws.decode_complete(
            signature, key, algorithms=list(ALGORITHMS), detached_payload=body
        )
    except jwt.PyJWTError as err:
        raise Unauthenticated("the notification's signature does not verify") from err
    if url is not None and header.get("aud") != url:
        raise Unauthenticated("the notification was meant for another webhook")
    return header
