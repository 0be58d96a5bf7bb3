"""The agent's mTLS clients of its peers: one reused per peer, retired on rotation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig
from gateway.runtime.stopping import cancel_and_wait
from gateway.telemetry.tracing import AgentTracing
from gateway.transport.live_tls import LiveTls

RETIRE_GRACE_SECONDS = 60.0
"""How long calls on a channel retired by a certificate rotation may still take."""


class PeerClients:
    """One reused :class:`PeerClient` per peer, made with the certificate in force."""

    def __init__(self, config: AgentConfig, tls: LiveTls, tracing: AgentTracing) -> None:
        self._config = config
        self._tls = tls
        self._tracing = tracing
        self._clients: dict[str, PeerClient] = {}
        self._relayed: set[str] = set()
        """Peers whose certificate carries only its URI SAN: their next client starts
        with the relay instead of finding out again."""
        self._retiring: set[asyncio.Task[None]] = set()

    def get(self, peer_id: str, address: str | None = None) -> PeerClient:
        """The client of ``peer_id`` (address from the config unless given)."""
        client = self._clients.get(peer_id)
        if client is None:
            target = address or self._config.peer(peer_id).address
            client = PeerClient(
                peer_id,
                target,
                self._tls.current,
                self._tracing,
                through_relay=peer_id in self._relayed,
            )
            self._clients[peer_id] = client
        return client

    def retire_all(self) -> None:
        """After a rotation: new clients use the new certificate; the old ones close
        once their calls in flight have had ``RETIRE_GRACE_SECONDS`` to end."""
        retired, self._clients = list(self._clients.values()), {}
        self._relayed |= {client.peer_id for client in retired if client.through_relay}
        for client in retired:
            self.retire(client.close(RETIRE_GRACE_SECONDS))

    def retire(self, closing: Coroutine[Any, Any, None]) -> None:
        """Run ``closing`` in the background (cut short by :meth:`close`)."""
        task = asyncio.get_running_loop().create_task(closing)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """Close every client now, then the retired ones still waiting out their grace."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        for closing in list(self._retiring):
            await cancel_and_wait(closing)


async def close_later(close: Callable[[], Awaitable[None]], grace: float) -> None:
    """Close after ``grace`` seconds (or at once if cancelled: the agent is stopping)."""
    try:
        await asyncio.sleep(grace)
    finally:
        await close()
