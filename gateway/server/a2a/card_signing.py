"""Agent cards signed with the agent's SVID key, as the A2A spec says (JWS over RFC 8785 JSON).

The a2a-sdk's signer canonicalizes the card (``signatures`` left out, empty
values dropped, RFC 8785) and signs those bytes as a detached JWS; this
module gives it the agent's key and a protected header naming the key:

- ``alg``: ``ES256`` (P-256 SVIDs) or ``RS256`` (RSA SVIDs),
- ``kid``: the agent's SPIFFE ID,
- ``x5c``: the certificate chain (the SVID first, base64 DER), so a client
  that trusts the trust domain's CA can check that the card came from the
  holder of that SPIFFE ID (``verify_card``; see docs/a2a-http.md).

A card is signed with the key in force when it is built: after a rotation the
next card carries the new chain. :meth:`CardSigner.sign_payload` signs other
canonical bytes with the same key and header: the card's A2A 0.3 form
(``gateway.server.a2a.card_v0_3``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, cast

from a2a.types import a2a_pb2
from a2a.utils.signing import ProtectedHeader, create_agent_card_signer, create_signature_verifier
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.verification import PolicyBuilder, Store
from jwt import api_jws

from gateway.errors import ConfigError, Unauthenticated
from gateway.transport.tls import TlsMaterial
from policies.identity import spiffe_id_from_pem


class CardSigner:
    """Signs with the agent's key and chain, those of ``material()`` at each signing."""

    def __init__(self, agent_id: str, material: Callable[[], TlsMaterial]) -> None:
        self._agent_id = agent_id
        self._material = material

    def __call__(self, card: a2a_pb2.AgentCard) -> a2a_pb2.AgentCard:
        """``card`` with one more signature: a detached JWS over its 1.0 canonical form."""
        tls = self._material()
        header = self._header(tls)
        return create_agent_card_signer(tls.key_pem, cast(ProtectedHeader, header))(card)

    def sign_payload(self, payload: bytes) -> a2a_pb2.AgentCardSignature:
        """A detached JWS over ``payload`` (canonical bytes), with the card's header."""
        tls = self._material()
        header = self._header(tls)
        jws = api_jws.encode(payload, tls.key_pem, algorithm=header["alg"], headers=header)
        protected, _, signature = jws.split(".")
        return a2a_pb2.AgentCardSignature(protected=protected, signature=signature)

    def _header(self, tls: TlsMaterial) -> dict[str, Any]:
        key = serialization.load_pem_private_key(tls.key_pem, password=None)
        chain = x509.load_pem_x509_certificates(tls.cert_pem)
        return {
            "alg": _algorithm(key),
            "typ": "JOSE",
            "kid": self._agent_id,
            "x5c": [
                base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
                for cert in chain
            ],
        }


def card_signer(agent_id: str, material: Callable[[], TlsMaterial]) -> CardSigner:
    """Signs cards with the key and chain of ``material()`` (read at each signing)."""
    return CardSigner(agent_id, material)


_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


def _algorithm(key: Any) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _EC_ALGORITHMS:
        return _EC_ALGORITHMS[key.curve.name]
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    raise ConfigError(
        "the agent's key is neither P-256/384/521 nor RSA: its cards cannot be signed"
    )


def verify_card(card: a2a_pb2.AgentCard, ca_pem: bytes, expected_id: str) -> None:
    """Check that ``card`` was signed by the holder of ``expected_id``'s SVID from ``ca_pem``.

    The chain in the signature's ``x5c`` must verify against ``ca_pem``, its
    leaf must hold exactly the SPIFFE ID ``expected_id``, and the JWS must
    verify with the leaf's key.

    Raises:
        Unauthenticated: any of the three does not hold.
    """
    if not card.signatures:
        raise Unauthenticated("the card is not signed")
    try:
        header = _protected_header(card.signatures[0])
        chain = [x509.load_der_x509_certificate(base64.b64decode(c)) for c in header["x5c"]]
    except (ValueError, KeyError, TypeError) as err:  # binascii.Error is a ValueError
        raise Unauthenticated("the card's signature header cannot be read") from err
    if not chain:
        raise Unauthenticated("the card's signature carries no certificate chain")
    _verify_chain(chain, ca_pem)
    leaf_pem = chain[0].public_bytes(serialization.Encoding.PEM)
    if spiffe_id_from_pem(leaf_pem) != expected_id:
        raise Unauthenticated("the card was signed by another SPIFFE ID")
    key_pem = (
        chain[0]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    verifier = create_signature_verifier(
        lambda _kid, _jku: key_pem, [*_EC_ALGORITHMS.values(), "RS256"]
    )
    try:
        verifier(card)
    except Exception as err:
        raise Unauthenticated("the card's signature does not verify") from err


def _protected_header(signature: a2a_pb2.AgentCardSignature) -> dict[str, Any]:
    padded = signature.protected + "=" * (-len(signature.protected) % 4)
    header = json.loads(base64.urlsafe_b64decode(padded))
    if not isinstance(header, dict):
        raise Unauthenticated("the card's signature header is not an object")
    return header


def _verify_chain(chain: list[x509.Certificate], ca_pem: bytes) -> None:
    store = Store(x509.load_pem_x509_certificates(ca_pem))
    verifier = PolicyBuilder().store(store).build_client_verifier()
    try:
        verifier.verify(chain[0], chain[1:])
    except Exception as err:
        raise Unauthenticated("the card's certificate chain does not verify") from err
