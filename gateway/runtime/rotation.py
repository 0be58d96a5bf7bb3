"""What a new own certificate changes in a running agent."""

from __future__ import annotations

from gateway.runtime.checkpoint_signing import checkpoint_signer, keep_signer_certificate
from gateway.runtime.parts import Parts
from gateway.runtime.peer_clients import RETIRE_GRACE_SECONDS, close_later
from gateway.transport.tls import TlsMaterial


def use_new_certificate(parts: Parts, material: TlsMaterial) -> None:
    """Present ``material`` from now on (``LiveTls`` calls this on every change).

    The gRPC server reads the material in force at each handshake by itself.
    New peer channels are built lazily with the new client certificate; the
    old ones close once their calls in flight have had time to end.
    """
    parts.public_card.invalidate()  # re-signed with the new key when next asked for
    if parts.https is not None:  # new HTTPS handshakes present the new certificate
        parts.https.use_tls(material)
    if parts.mcp is not None:
        parts.mcp.use_tls(material)
    if parts.checkpoints is not None:  # a rotated-away key signs nothing more
        keep_signer_certificate(parts.config, material)
        parts.checkpoints.use_signer(checkpoint_signer(parts.config, material))
    parts.clients.retire_all()
    for upstream in parts.upstreams:
        link = upstream.use_tls(material)
        if link is not None:
            parts.clients.retire(close_later(link.aclose, RETIRE_GRACE_SECONDS))
    for mcp_upstream in parts.mcp_upstreams:
        mcp_upstream.use_tls(material, RETIRE_GRACE_SECONDS)
