"""A small OIDC issuer the identity tests run: a JWKS over HTTPS and an RFC 8693 token endpoint.

It serves on ``https://localhost:PORT`` with a certificate of its own session
CA (the agents pin that CA: ``ca = ...``), signs tokens with ES256 and RS256
keys minted for the session, and counts the JWKS fetches (to see an unknown
``kid`` refetch once, not once per call).

``POST /token`` is an RFC 8693 token exchange authenticated by the calling
agent's client certificate (mutual TLS, RFC 8705 ``tls_client_auth``): given a
``subject_token`` this issuer signed and an ``audience``, it answers a token for
the same user, for that audience, whose ``act`` names the calling agent (and,
nested, the actors of the subject token).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from gateway.devtools.pki import CertificateAuthority, init_ca

EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"


@dataclass
class SigningKey:
    """A session key: its kid, private key, algorithm and public JWK."""

    kid: str
    alg: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        algorithm = ECAlgorithm if self.alg.startswith("ES") else RSAAlgorithm
        public = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "use": "sig", "alg": self.alg}


def es256_key(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


def rs256_key(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def sign(key: SigningKey, claims: dict[str, Any], **headers: Any) -> str:
    """A JWT of ``claims`` signed by ``key`` (its kid in the header unless overridden)."""
    header = {"kid": key.kid, **headers}
    return jwt.encode(claims, key.private, algorithm=key.alg, headers=header)


@dataclass
class SessionIssuer:
    """The running issuer: its URL, CA file, keys and what it was asked."""

    url: str
    ca_file: Path
    keys: list[SigningKey]
    jwks_fetches: int = 0
    exchanges: list[dict[str, str]] = field(default_factory=list)

    @property
    def jwks_url(self) -> str:
        return self.url + "/jwks.json"

    @property
    def token_url(self) -> str:
        return self.url + "/token"

    def token(
        self,
        sub: str,
        aud: str | list[str],
        *,
        key: SigningKey | None = None,
        lifetime: float = 300.0,
        headers: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A token of this issuer (``iss`` = its URL) for ``sub`` and ``aud``."""
        now = int(time.time())
        body = {"iss": self.url, "sub": sub, "aud": aud, "iat": now, "exp": now + int(lifetime)}
        body.update(claims)
        return sign(key or self.keys[0], body, **(headers or {}))

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.jwk() for key in self.keys]}


class _Handler(BaseHTTPRequestHandler):
    issuer: SessionIssuer
    agents_ca: bytes

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return None

    def do_GET(self) -> None:
        if self.path != "/jwks.json":
            self._answer(404, {"error": "not_found"})
            return
        self.issuer.jwks_fetches += 1
        self._answer(200, self.issuer.jwks())

    def do_POST(self) -> None:
        if self.path != "/token":
            self._answer(404, {"error": "not_found"})
            return
        length = int(self.headers.get("content-length", "0"))
        form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        actor = self._client_spiffe_id()
        if actor is None:
            self._answer(401, {"error": "invalid_client"})
            return
        if form.get("grant_type") != EXCHANGE_GRANT or "audience" not in form:
            self._answer(400, {"error": "invalid_request"})
            return
        try:
            subject = jwt.decode(
                form.get("subject_token", ""),
                self._public_key(form.get("subject_token", "")),
                algorithms=["ES256", "RS256"],
                options={"verify_aud": False},
                issuer=self.issuer.url,
            )
        except jwt.PyJWTError:
            self._answer(400, {"error": "invalid_grant"})
            return
        self.issuer.exchanges.append({"actor": actor, "audience": form["audience"]})
        act: dict[str, Any] = {"sub": actor}
        if isinstance(subject.get("act"), dict):
            act["act"] = subject["act"]
        kept = {k: v for k, v in subject.items() if k in ("groups", "scope", "email")}
        token = self.issuer.token(subject["sub"], form["audience"], act=act, **kept)
        self._answer(
            200,
            {
                "access_token": token,
                "issued_token_type": ACCESS_TOKEN_TYPE,
                "token_type": "Bearer",
                "expires_in": 300,
            },
        )

    def _public_key(self, token: str) -> Any:
        kid = jwt.get_unverified_header(token).get("kid")
        for key in self.issuer.keys:
            if key.kid == kid:
                return key.private.public_key()
        raise jwt.InvalidKeyError("unknown kid")

    def _client_spiffe_id(self) -> str | None:
        der = self.connection.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        if not der:
            return None
        cert = x509.load_der_x509_certificate(der)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        return uris[0] if uris else None

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def running_issuer(folder: Path, agents_ca: Path) -> Iterator[SessionIssuer]:
    """An issuer on ``https://localhost:PORT`` with its own CA (in ``folder``), taking
    client certificates of ``agents_ca`` at its token endpoint."""
    init_ca(folder, "idp.test")
    ca = CertificateAuthority.load(folder)
    cert, key = ca.mint(uris=["spiffe://idp.test/issuer"], dns_names=["localhost"])
    (folder / "server.pem").write_bytes(cert)
    (folder / "server.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    context.load_verify_locations(cafile=str(agents_ca))
    context.verify_mode = ssl.CERT_OPTIONAL
    server = ThreadingHTTPServer(("localhost", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    issuer = SessionIssuer(
        url=f"https://localhost:{server.server_address[1]}",
        ca_file=folder / "ca.pem",
        keys=[es256_key("es-" + uuid.uuid4().hex[:8]), rs256_key("rs-" + uuid.uuid4().hex[:8])],
    )
    handler = type("Handler", (_Handler,), {"issuer": issuer})
    server.RequestHandlerClass = handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
