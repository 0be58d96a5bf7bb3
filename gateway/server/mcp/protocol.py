"""The MCP listener's protocol: the A2A HTTPS one, with a response's writes sent together.

uvicorn writes a response's head as soon as the app starts the response, and
its body when the app sends it: two TLS records and two ``send`` system calls
for every answer, where one would do. On the agent's loopback benchmarks
those writes were half the server's CPU per ``tools/call``. Here each
connection's writes made in one turn of the event loop are joined and written
once, at the end of that turn (``call_soon``): the head and body of a JSON
answer leave in one record; an event stream's events still leave as they are
sent, a turn later at most.

Everything else is :class:`~gateway.server.a2a_http.protocol.VerifiedPeerProtocol`'s
(the verified client certificate in every scope, the connection budget, the
request head's deadline).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.server.a2a_http.protocol import ConnectionBudget, VerifiedPeerProtocol


class JoinedWrites:
    """A transport whose writes within one turn of the loop go out as one write."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        """Queue ``data``; the turn's writes are written together once it ends."""
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        """Write what was queued (nothing if the connection is closing)."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Write what was queued, then close."""
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        """Drop what was queued and the connection, at once."""
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class JoinedWritesProtocol(VerifiedPeerProtocol):
    """:class:`VerifiedPeerProtocol` whose responses' writes are joined per turn."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """As the A2A protocol; then its requests write through :class:`JoinedWrites`."""
        super().connection_made(transport)
        if not transport.is_closing():
            self.transport = JoinedWrites(transport, self.loop)  # type: ignore[assignment]


def joined_budgeted(budget: ConnectionBudget) -> type[JoinedWritesProtocol]:
    """:class:`JoinedWritesProtocol` for one server, bounded by ``budget``."""
    return type("BudgetedMcpProtocol", (JoinedWritesProtocol,), {"budget": budget})
