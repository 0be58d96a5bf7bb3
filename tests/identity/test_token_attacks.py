"""Hostile tokens: each refused with its precise reason, audited, and never stored or echoed.

Every case is sent as a token-only caller over HTTP+JSON (where a token alone
could open the door) and must be refused 401 with the reason code below, one
audit record naming that reason, nothing run, and the token's text nowhere in
the audit log or the answer. ``alg`` confusion (``none``; ``HS256`` keyed with
the issuer's public key, the classic attack on verifiers that take the
algorithm from the token), oversized tokens, ``kid`` games (unknown, another
issuer's, a path), expiry, audience, issuer, lifetime, a forged signature.
"""

from __future__ import annotations

import base64
import hmac
import json
import time
from collections.abc import Callable
from hashlib import sha256
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import REST_PATH
from tests.a2a_http_support import V1_HEADERS, https_client, message_params, our_reason
from tests.identity.conftest import ALICE, SvidKeys
from tests.identity.issuer import SessionIssuer, sign
from tests.support import Pki, WriteCounter, audit_rows


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    return ".".join(
        [b64(json.dumps(header).encode()), b64(json.dumps(claims).encode()), b64(signature)]
    )


def claims(issuer: SessionIssuer, **change: Any) -> dict[str, Any]:
    now = int(time.time())
    return {
        "iss": issuer.url,
        "sub": "bob-client",
        "aud": ALICE,
        "iat": now,
        "exp": now + 300,
    } | change


def alg_none(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return unsigned({"alg": "none", "kid": issuer.keys[0].kid}, claims(issuer)) + "x"


def hs256_with_public_key(issuer: SessionIssuer, svid: SvidKeys) -> str:
    # The RSA public key (PEM) as an HMAC secret: verifiers that let the token choose
    # the algorithm accept this; the key is public, so anyone can make one.
    rsa_key = issuer.keys[1]
    secret = rsa_key.private.public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
    )
    head = b64(json.dumps({"alg": "HS256", "kid": rsa_key.kid}).encode())
    body = b64(json.dumps(claims(issuer)).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def oversized(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("bob-client", ALICE, padding="p" * 9000)


def unknown_kid(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("bob-client", ALICE, headers={"kid": "no-such-key"})


def path_kid(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("bob-client", ALICE, headers={"kid": "../../../../etc/passwd"})


def other_issuers_kid(issuer: SessionIssuer, svid: SvidKeys) -> str:
    # Signed with the JWT-SVID key and naming its kid, but claiming the OIDC issuer:
    # a kid is looked up only among the keys of the issuer the token names.
    return sign(svid.key, claims(issuer))


def expired(issuer: SessionIssuer, svid: SvidKeys) -> str:
    now = int(time.time())
    return issuer.token("bob-client", ALICE, iat=now - 900, exp=now - 600)


def not_yet_valid(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("bob-client", ALICE, nbf=int(time.time()) + 600)


def wrong_audience(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("bob-client", "spiffe://example.org/agent/carol")


def unknown_issuer(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return sign(issuer.keys[0], claims(issuer, iss="https://evil.example"))


def too_long_lived(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("bob-client", ALICE, lifetime=30 * 86400)


def forged_signature(issuer: SessionIssuer, svid: SvidKeys) -> str:
    head, _body, signature = issuer.token("bob-client", ALICE).split(".")
    tampered = b64(json.dumps(claims(issuer, sub="carol-client")).encode())
    return f"{head}.{tampered}.{signature}"


def svid_of_another_domain(issuer: SessionIssuer, svid: SvidKeys) -> str:
    now = int(time.time())
    return sign(svid.key, {"sub": "spiffe://evil.org/agent/bob", "aud": [ALICE], "exp": now + 60})


def unmapped_client(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return issuer.token("mallory-client", ALICE)


def not_a_jwt(issuer: SessionIssuer, svid: SvidKeys) -> str:
    return "this-is-not-a-token"


CASES: list[tuple[Callable[[SessionIssuer, SvidKeys], str], str]] = [
    (alg_none, "TOKEN_INVALID"),
    (hs256_with_public_key, "TOKEN_INVALID"),
    (oversized, "TOKEN_INVALID"),
    (unknown_kid, "TOKEN_INVALID"),
    (path_kid, "TOKEN_INVALID"),
    (other_issuers_kid, "TOKEN_INVALID"),
    (expired, "TOKEN_EXPIRED"),
    (not_yet_valid, "TOKEN_INVALID"),
    (wrong_audience, "TOKEN_AUDIENCE_MISMATCH"),
    (unknown_issuer, "TOKEN_ISSUER_UNKNOWN"),
    (svid_of_another_domain, "TOKEN_ISSUER_UNKNOWN"),
    (too_long_lived, "TOKEN_INVALID"),
    (forged_signature, "TOKEN_SIGNATURE_INVALID"),
    (unmapped_client, "TOKEN_INVALID"),
    (not_a_jwt, "TOKEN_INVALID"),
]


@pytest.mark.parametrize(("make", "reason"), CASES, ids=[case.__name__ for case, _ in CASES])
async def test_a_hostile_token_is_refused_audited_and_never_kept(
    pki: Pki,
    alice: Agent,
    issuer: SessionIssuer,
    svid: SvidKeys,
    counter: WriteCounter,
    make: Callable[[SessionIssuer, SvidKeys], str],
    reason: str,
) -> None:
    token = make(issuer, svid)
    async with https_client(pki, None) as client:
        response = await client.post(
            alice.https_url + REST_PATH + "/message:send",
            json=message_params("notes.write", {"text": "v"}),
            headers={**V1_HEADERS, "Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="a2agw", error="invalid_token"'
    assert our_reason(response.json()["error"]["details"]) == reason
    await alice.audit.flush()
    [record] = audit_rows(alice.config.audit_db)
    assert (record.peer_id, record.decision, record.reason) == ("", "refuse", reason)
    assert counter.calls == 0
    secret_part = token.split(".")[-1] or token
    stored = alice.config.audit_db.read_bytes()
    for part in {secret_part, token[:40]}:
        assert part.encode() not in stored
        assert part not in response.text


async def test_an_unknown_kid_refetches_the_keys_once_not_per_call(
    pki: Pki, alice: Agent, issuer: SessionIssuer
) -> None:
    before = issuer.jwks_fetches
    async with https_client(pki, None) as client:
        for _ in range(5):
            response = await client.post(
                alice.https_url + REST_PATH + "/message:send",
                json=message_params("text.echo", {"text": "x"}),
                headers={**V1_HEADERS, "Authorization": f"Bearer {unknown_kid(issuer, None)}"},  # type: ignore[arg-type]
            )
            assert our_reason(response.json()["error"]["details"]) == "TOKEN_INVALID"
    assert issuer.jwks_fetches - before == 1
