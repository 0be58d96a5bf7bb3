"""Certificate rotation on the HTTPS port: the next handshake and the next card use the new SVID."""

from __future__ import annotations

import asyncio
import base64
import json
from urllib.parse import urlsplit

from cryptography import x509

from gateway.runtime.agent import Agent
from policies.identity import svid_dns_name
from tests.a2a_http_support import client_context, https_client
from tests.support import Pki, spiffe


async def served_serial(pki: Pki, agent: Agent) -> int:
    """The serial of the certificate a new TLS handshake with the HTTPS port presents."""
    url = urlsplit(agent.https_url)
    _, writer = await asyncio.open_connection(
        url.hostname, url.port, ssl=client_context(pki, "bob"), server_hostname="localhost"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def card_signer_serial(pki: Pki, agent: Agent, etag: str = "") -> tuple[int, str, int]:
    """The serial of the certificate in the public card's signature header (x5c), the card's
    ETag, and the status of a GET conditional on ``etag``."""
    url = agent.https_url + "/.well-known/agent-card.json"
    async with https_client(pki, None) as client:
        answer = await client.get(url)
        conditional = await client.get(url, headers={"If-None-Match": etag or 'W/"none"'})
    protected = answer.json()["signatures"][0]["protected"]
    header = json.loads(base64.urlsafe_b64decode(protected + "=" * (-len(protected) % 4)))
    serial = x509.load_der_x509_certificate(base64.b64decode(header["x5c"][0])).serial_number
    return serial, answer.headers["etag"], conditional.status_code


async def test_a_rotated_certificate_serves_the_next_handshake_and_signs_the_next_card(
    pki: Pki, alice: Agent
) -> None:
    old = await served_serial(pki, alice)
    signer, etag, _ = await card_signer_serial(pki, alice)
    assert signer == old
    assert (await card_signer_serial(pki, alice, etag))[2] == 304  # unchanged: revalidated
    cert, key = pki.ca.mint(
        uris=[spiffe("alice")], dns_names=[svid_dns_name(spiffe("alice")), "localhost"]
    )
    alice.config.tls.key.write_bytes(key)
    alice.config.tls.cert.write_bytes(cert)
    alice.reload()  # what SIGHUP (or the file watcher) does
    new = x509.load_pem_x509_certificate(cert).serial_number
    assert new != old
    assert await served_serial(pki, alice) == new
    # Re-signed with the new key: a new ETag, and the old one no longer answers 304.
    signer, new_etag, conditional = await card_signer_serial(pki, alice, etag)
    assert (signer, conditional) == (new, 200) and new_etag != etag
