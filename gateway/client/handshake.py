"""Whether a server is the identity a client asked for: decided by TLS handshakes only.

A call that fails before it is sent may go elsewhere, so *why* it failed must
come from this side: a server that received a call can answer any status with
any text or ``ErrorInfo`` ("Hostname Verification Check failed",
``PEER_IDENTITY_MISMATCH``) and would otherwise make a call that ran look as if
nothing was sent. So:

* a call is sent only on a READY channel (:func:`channel_connected`), i.e. once
  the TLS handshake, which checks the server's identity, has succeeded;
* when a channel fails to connect, nothing was sent, and a handshake of our own
  (:func:`probe_server_identity`: same bundle, the SPIFFE ID pinned by its URI
  SAN) tells whether the server's certificate is for another identity, or for
  the expected one without the DNS name gRPC verifies (the caller then goes
  through ``gateway.client.spiffe_relay``). gRPC Python reports its own
  handshake error only as status text, the very thing a server can also send.

Used by ``PeerClient`` (peers) and ``gateway.client.a2a.upstream_reach``
(upstream A2A agents).
"""

from __future__ import annotations

import asyncio
import ssl
from enum import Enum

import grpc
from grpc import aio

from gateway.client.pinned_tls import WrongServerIdentity, carries_derived_name


async def channel_connected(channel: aio.Channel) -> bool:
    """Wait until ``channel`` is READY (True) or fails to connect (False).

    No timeout of its own: callers bound it (the call's deadline, the
    capability runner's timeout).
    """
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            return False
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)
    return True


class ServerIdentity(Enum):
    """What our own handshake found the server to be (see :func:`probe_server_identity`)."""

    EXPECTED = "the expected SPIFFE ID, with the DNS name derived from it"
    EXPECTED_URI_ONLY = "the expected SPIFFE ID, without the derived DNS name"
    ANOTHER = "a certificate of the bundle for another identity"
    UNKNOWN = "no verdict: refused, closed, timed out, or another verification error"


def names_another_identity(err: ssl.SSLError) -> bool:
    """True if our own handshake refused the server for holding another identity."""
    return isinstance(err, WrongServerIdentity)


async def probe_server_identity(
    address: str, context: ssl.SSLContext, expected_id: str, timeout: float
) -> ServerIdentity:
    """Who the server at ``address`` is, by a TLS handshake of our own.

    ``context`` comes from ``gateway.client.pinned_tls.pinned_context`` for
    ``expected_id``: it presents our certificate (so the handshake completes
    under TLS 1.2 too) and checks the SPIFFE ID in the handshake. The
    connection is closed at once; nothing is sent on it.
    """
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(timeout):
            # SNI: the host dialled (none for an IP address); no name is verified.
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=context)
    except WrongServerIdentity:
        return ServerIdentity.ANOTHER
    except (OSError, TimeoutError, ValueError):  # ssl errors are OSErrors
        return ServerIdentity.UNKNOWN
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    # No TLS close: a gRPC server answers close_notify only when its handshake
    # timeout ends the connection that never sent the HTTP/2 preface.
    writer.transport.abort()
    if der and carries_derived_name(der, expected_id):
        return ServerIdentity.EXPECTED
    return ServerIdentity.EXPECTED_URI_ONLY
