"""Whether a server is the identity a client asked for: decided by TLS handshakes only.

A call that fails before it is sent may go elsewhere, so *why* it failed must
come from this side: a server that received a call can answer any status with
any text or ``ErrorInfo`` ("Hostname Verification Check failed",
``PEER_IDENTITY_MISMATCH``) and would otherwise make a call that ran look as if
nothing was sent. So:

* a call is sent only on a READY channel (:func:`channel_connected`), i.e. once
  the TLS handshake, which checks the server's identity, has succeeded;
* when a channel fails to connect, nothing was sent, and a handshake of our own
  (:func:`serves_another_identity`: same CA, same expected name) tells whether
  the server's certificate is for another identity. gRPC Python reports its own
  handshake error only as status text, the very thing a server can also send.

Used by ``PeerClient`` (peers) and ``gateway.client.a2a.upstream_reach``
(upstream A2A agents).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import grpc
from grpc import aio

_HOSTNAME_MISMATCH = 62  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH


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


def identity_check_context(ca_pem: bytes) -> ssl.SSLContext:
    """A client context that trusts only ``ca_pem`` and verifies the server's name.

    It presents no certificate: the client checks the server's certificate as
    soon as it arrives, before it would send its own, so the check needs none.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    return context


def names_another_identity(err: ssl.SSLCertVerificationError) -> bool:
    """True if our OpenSSL refused the certificate because it is not valid for the name."""
    return err.verify_code == _HOSTNAME_MISMATCH


async def serves_another_identity(
    address: str, context: ssl.SSLContext, server_name: str, timeout: float
) -> bool:
    """True only when our own handshake with ``address`` found its certificate not
    valid for ``server_name``.

    False for anything else: refused, closed, timed out, another verification
    error, or a handshake that now succeeds.
    """
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host.strip("[]"), int(port), ssl=context, server_hostname=server_name
            ),
            timeout,
        )
    except ssl.SSLCertVerificationError as err:
        return names_another_identity(err)
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return False
