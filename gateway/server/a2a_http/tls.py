"""The HTTPS side's TLS: a client certificate requested, verified, never required.

Only ``GET /.well-known/agent-card.json`` may be answered without a client
certificate, so the handshake asks for one (``CERT_OPTIONAL``) and verifies
whatever is sent against the agent's CA; a certificate that does not verify
fails the handshake (as on the gRPC port). Whether a request may go on
without one is the edge's decision (``gateway.server.a2a_http.edge``),
made from the verified handshake alone: headers never name the caller.

Certificate rotation: the listening context's ``sni_callback`` (run for every
ClientHello, with or without SNI) hands each new handshake the context built
from the material in force, so a rotated certificate and CA take effect on
the next connection without rebinding the port. Connections already open
keep the handshake they made.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

from gateway.transport.tls import TlsMaterial


def server_context(material: TlsMaterial) -> ssl.SSLContext:
    """A TLS 1.2+ server context: the agent's SVID, client certificates verified if sent."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(cadata=material.ca_pem.decode("ascii"))
    _load_key_pair(context, material)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _load_key_pair(context: ssl.SSLContext, material: TlsMaterial) -> None:
    # ssl loads keys from files only: a private folder, removed at once.
    with tempfile.TemporaryDirectory(prefix="a2agw-tls-") as folder:
        cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert.write_bytes(material.cert_pem)
        descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(material.key_pem)
        context.load_cert_chain(cert, key)


class LiveServerContext:
    """The listening context; each handshake is given the context of the material in force."""

    def __init__(self, material: TlsMaterial) -> None:
        self._current = server_context(material)
        self.listening = server_context(material)
        """Pass this one to the server; it switches every handshake to the current one."""
        self.listening.sni_callback = self._switch

    def use(self, material: TlsMaterial) -> None:
        """New handshakes use ``material`` (built here, so a bad set raises before it is used)."""
        self._current = server_context(material)

    def _switch(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        connection.context = self._current
