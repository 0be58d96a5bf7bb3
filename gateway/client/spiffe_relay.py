"""A relay that lets a gRPC channel reach a server whose SVID carries only its SPIFFE ID.

gRPC Python verifies a server only by a DNS name (``grpc.ssl_target_name_override``)
and offers no hook to verify it otherwise, so an SVID without the derived DNS
name (the usual SPIRE registration, with no ``-dns``) cannot be pinned by a
``grpc.aio.secure_channel``. The channel then speaks plaintext HTTP/2 to this
relay over a Unix socket of this process, and the relay carries each connection
on over TLS of its own (``gateway.client.pinned_tls``): the chain verified to
the trust bundle of the server's trust domain, the leaf's one URI SAN equal to
the expected SPIFFE ID, both inside the handshake.

Invariants:

* Nothing the channel writes leaves this process before that handshake has
  succeeded: the Unix side is not read until then, and a failed handshake
  closes it, so the channel fails to connect and nothing was sent.
* Only this process reaches the socket: it lives in a folder of mode 0700, and
  a connection from any other process (``SO_PEERCRED``) is closed unread, so
  no local program can borrow this agent's certificate through it.
* Flow control end to end: a side whose peer cannot take more stops being read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import ssl
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

from gateway.runtime.stopping import cancel_and_wait
from gateway.transport.tls import HANDSHAKE_SECONDS

_log = logging.getLogger(__name__)
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class _Leg(asyncio.Protocol):
    """One side of a relayed connection; what it receives goes to the other side."""

    def __init__(
        self,
        on_made: Callable[[_Leg], None] | None = None,
        on_lost: Callable[[_Leg], None] | None = None,
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Leg | None = None
        self._on_made = on_made
        self._on_lost = on_lost
        self._early: list[bytes] = []
        """What arrived before the other side was linked (the server's first frames)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.write(data)
        else:
            self._early.append(data)
            if self.transport is not None:
                self.transport.pause_reading()  # until linked: only what came first is held

    def link(self, other: _Leg) -> None:
        """Send what arrived before to ``other``, and all that follows."""
        self.other = other
        early, self._early = self._early, []
        if other.transport is not None:
            for data in early:
                other.transport.write(data)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        self._close_other()
        return False  # HTTP/2 has no use for a half-closed connection: close this side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_other()
        if self._on_lost is not None:
            self._on_lost(self)

    def pause_writing(self) -> None:  # the other side's data waits: stop reading it
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def _close_other(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()  # after what is buffered has been written


class SpiffeRelay:
    """A private Unix socket whose connections go on, pinned, to one server.

    Args:
        address: The server's ``host:port``.
        context: A client context from ``pinned_context`` (it checks the
            SPIFFE ID); :meth:`use_context` replaces it after a rotation.
            The SNI is the host dialled (none for an IP address).
    """

    def __init__(self, address: str, context: ssl.SSLContext) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._context = context
        self._folder: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._legs: set[_Leg] = set()
        self._connecting: set[asyncio.Task[None]] = set()

    @property
    def target(self) -> str:
        """The gRPC target of the socket (``unix:/path``); valid once started."""
        assert self._folder is not None, "the relay has not started"
        return f"unix:{self._folder / 'relay.sock'}"

    async def start(self) -> str:
        """Listen on a new socket in a private folder; its gRPC target."""
        self._folder = Path(tempfile.mkdtemp(prefix="a2agw-relay-"))  # mode 0700
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            self._accepted, path=str(self._folder / "relay.sock")
        )
        return self.target

    def use_context(self, context: ssl.SSLContext) -> None:
        """Open later connections with ``context`` (a rotated certificate)."""
        self._context = context

    def _accepted(self) -> _Leg:
        return _Leg(on_made=self._inbound, on_lost=self._legs.discard)

    def _inbound(self, inner: _Leg) -> None:
        transport = inner.transport
        assert transport is not None
        transport.pause_reading()  # nothing is read before the server is verified
        if not _from_this_process(transport):
            _log.warning("relay: closed a connection from another process")
            transport.close()
            return
        self._legs.add(inner)
        task = asyncio.get_running_loop().create_task(self._link(inner, transport))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _link(self, inner: _Leg, transport: asyncio.Transport) -> None:
        outer = _Leg(on_lost=self._legs.discard)
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: outer,
                self._host,
                self._port,
                ssl=self._context,
                ssl_handshake_timeout=HANDSHAKE_SECONDS,
            )
        except (OSError, TimeoutError, ValueError) as err:  # ssl errors are OSErrors
            _log.info("relay to %s:%s: %s", self._host, self._port, err)
            transport.close()
            return
        if transport.is_closing():  # the channel gave up meanwhile
            if outer.transport is not None:
                outer.transport.close()
            return
        self._legs.add(outer)
        outer.link(inner)  # the server's first frames, if already here, go first
        inner.link(outer)

    async def close(self) -> None:
        """Stop listening, cut every relayed connection, remove the socket's folder."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connecting):
            await cancel_and_wait(task)
        for leg in list(self._legs):
            if leg.transport is not None:
                leg.transport.close()
        self._legs.clear()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _from_this_process(transport: asyncio.Transport) -> bool:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return False
    pid, _uid, _gid = _PEERCRED.unpack(raw)
    return bool(pid == os.getpid())
