"""The detached JWS on push notifications: what it covers, and who a receiver finds signed it."""

from __future__ import annotations

import base64
import json

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.errors import Unauthenticated
from gateway.push.signature import NotificationSigner, verify_notification
from gateway.transport.tls import TlsMaterial
from tests.support import Pki, spiffe

BODY = b'{"statusUpdate":{"taskId":"t-1","status":{"state":"TASK_STATE_WORKING"}}}'
URL = "https://hooks.example.com/a2a?x=1"


def signer(pki: Pki, name: str = "alice") -> tuple[NotificationSigner, TlsMaterial]:
    material = pki.material(name)
    return NotificationSigner(spiffe(name), lambda: material), material


def test_the_header_is_a_detached_unencoded_jws_with_the_svid_chain(pki: Pki) -> None:
    sign, material = signer(pki)
    value = sign.sign(BODY, url=URL, notification_id="n-1")
    protected, payload, _ = value.split(".")
    assert payload == ""  # detached
    header = json.loads(base64.urlsafe_b64decode(protected + "=" * (-len(protected) % 4)))
    assert header["alg"] == "ES256" and header["b64"] is False and header["crit"] == ["b64"]
    assert (header["kid"], header["jti"], header["aud"]) == (spiffe("alice"), "n-1", URL)
    assert "typ" not in header
    leaf = x509.load_der_x509_certificate(base64.b64decode(header["x5c"][0]))
    assert leaf.public_bytes(serialization.Encoding.PEM) == x509.load_pem_x509_certificates(
        material.cert_pem
    )[0].public_bytes(serialization.Encoding.PEM)
    # A receiver with PyJWT alone: the body is the payload, as sent.
    decoded = jwt.api_jws.decode_complete(
        value, leaf.public_key(), algorithms=["ES256"], detached_payload=BODY
    )
    assert decoded["payload"] == BODY
    assert (
        verify_notification(BODY, value, material.ca_pem, spiffe("alice"), url=URL)["jti"] == "n-1"
    )


def test_a_changed_body_another_webhook_identity_or_ca_does_not_verify(pki: Pki) -> None:
    sign, material = signer(pki)
    value = sign.sign(BODY, url=URL, notification_id="n-1")
    foreign = pki.foreign_material("bob").ca_pem
    for body, signature, ca, expected, url in (
        (BODY + b" ", value, material.ca_pem, spiffe("alice"), URL),
        (BODY, value, material.ca_pem, spiffe("alice"), "https://other.example/"),
        (BODY, value, material.ca_pem, spiffe("bob"), URL),
        (BODY, value, foreign, spiffe("alice"), URL),
        (BODY, "not.a.jws", material.ca_pem, spiffe("alice"), URL),
    ):
        with pytest.raises(Unauthenticated):
            verify_notification(body, signature, ca, expected, url=url)


def test_a_signature_by_another_agent_of_the_same_ca_names_that_agent(pki: Pki) -> None:
    mallory, material = signer(pki, "mallory")
    value = mallory.sign(BODY, url=URL, notification_id="n-1")
    with pytest.raises(Unauthenticated, match="another SPIFFE ID"):
        verify_notification(BODY, value, material.ca_pem, spiffe("alice"), url=URL)


def test_a_rotated_key_signs_the_next_notification(pki: Pki) -> None:
    current = [pki.material("alice")]
    sign = NotificationSigner(spiffe("alice"), lambda: current[0])
    before = sign.sign(BODY, url=URL, notification_id="n-1")
    current[0] = pki.odd_material(uris=[spiffe("alice")])
    after = sign.sign(BODY, url=URL, notification_id="n-2")
    ca = current[0].ca_pem
    for value in (before, after):
        verify_notification(BODY, value, ca, spiffe("alice"), url=URL)
    assert jwt.get_unverified_header(before)["x5c"] != jwt.get_unverified_header(after)["x5c"]
