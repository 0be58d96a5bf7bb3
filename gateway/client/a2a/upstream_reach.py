"""Whether a call to an upstream was sent, and why not: decided from the connection.

Never from what the upstream said. An upstream that received a call can
answer any status with any text (``UNAVAILABLE`` "Hostname Verification Check
failed", or an ``ErrorInfo`` claiming ``PEER_IDENTITY_MISMATCH``); the audit
must not then say that nothing was sent. So:

* gRPC: a call is sent only once its channel is READY, i.e. the TLS handshake,
  which checks the upstream's identity, has succeeded. A channel that fails
  to connect means nothing was sent; a handshake of our own (same certificate
  and bundle, the SPIFFE ID pinned by its URI SAN) then says why:
  ``PEER_IDENTITY_MISMATCH`` when the server's certificate is for another
  identity, else ``PEER_UNAVAILABLE`` (both from ``gateway.client.handshake``,
  shared with ``PeerClient``).
* JSON-RPC: httpx's ``ConnectError``/``ConnectTimeout`` mean nothing was sent;
  the ``WrongServerIdentity`` our own handshake raised tells a wrong identity.

Once a call may have been sent, ``UNAVAILABLE`` (answered by the upstream, or
the connection lost) is ``SENT_THEN_UNAVAILABLE``: the call may have run.
"""

from __future__ import annotations

import ssl

import grpc
import httpx

from gateway.client.handshake import ServerIdentity, names_another_identity
from gateway.errors import PeerIdentityMismatch, PeerUnavailable

NOT_SENT = PeerUnavailable.reason
"""Audit detail: the upstream could not be reached; nothing was sent."""
WRONG_IDENTITY = PeerIdentityMismatch.reason
"""Audit detail: its certificate is for another identity (found in the handshake); nothing sent."""
SENT_THEN_UNAVAILABLE = "PEER_UNAVAILABLE_AFTER_SEND"
"""Audit detail: the call may have reached the upstream, which may have run it."""


def identity_cause(identity: ServerIdentity) -> str:
    """The audit detail for what our own handshake found (``probe_server_identity``).

    ``WRONG_IDENTITY`` only when the certificate is for another identity;
    anything else (refused, closed, another verification error, a handshake
    that now succeeds) is ``NOT_SENT``.
    """
    return WRONG_IDENTITY if identity is ServerIdentity.ANOTHER else NOT_SENT


def http_cause(err: BaseException) -> str | None:
    """The detail for an httpx failure in ``err``'s chain; None if there is none.

    A read timeout is not one: a slow answer is the runner's CAPABILITY_TIMEOUT.
    """
    chain = exception_chain(err)
    if any(isinstance(c, httpx.ConnectError | httpx.ConnectTimeout) for c in chain):
        for cause in chain:
            if isinstance(cause, ssl.SSLCertVerificationError):
                return WRONG_IDENTITY if names_another_identity(cause) else NOT_SENT
        return NOT_SENT
    if any(
        isinstance(c, httpx.TransportError) and not isinstance(c, httpx.ReadTimeout) for c in chain
    ):
        return SENT_THEN_UNAVAILABLE
    return None


def grpc_cause(err: BaseException) -> str | None:
    """``SENT_THEN_UNAVAILABLE`` for an UNAVAILABLE call in ``err``'s chain, else None.

    Only asked about calls sent on a READY channel (see ``channel_connected``).
    """
    for cause in exception_chain(err):
        if isinstance(cause, grpc.RpcError):
            code = cause.code() if hasattr(cause, "code") else None
            return SENT_THEN_UNAVAILABLE if code == grpc.StatusCode.UNAVAILABLE else None
    return None


def exception_chain(err: BaseException) -> list[BaseException]:
    """``err`` and its causes/contexts, oldest last (at most 16)."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
