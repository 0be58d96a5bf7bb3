"""The ``tools/call`` requests running in this process, for ``notifications/cancelled``.

MCP clients of the handshake era cancel a request by sending
``notifications/cancelled`` with its JSON-RPC id, in a request of its own. A
stateless server has no session to find the call in, so this table keys
running calls by the caller's SPIFFE ID (from its certificate, as every
request's) and the id: a caller can only ever cancel its own calls.

JSON-RPC ids are numbered per client connection, so two sessions of one caller
may run calls with the same id at once; a cancellation that names such an id
cancels neither (the call runs on and is answered). A call is only found in
the process that runs it: with ``workers > 1`` or several replicas, the
notification may reach another one. Closing the request's response stream
(what the 2026 revision of MCP makes the only way) always cancels the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CANCELLED_BY_CLIENT = "cancelled by the MCP client (notifications/cancelled)"
"""Audit detail of a call its client cancelled with a notification."""
CLIENT_WENT_AWAY = "cancelled: the MCP client closed the request"
"""Audit detail of a call whose client closed its request (connection or stream)."""


@dataclass(slots=True)
class RunningCall:
    """One running call: the task serving it, and whether a notification cancelled it."""

    task: asyncio.Task[object]
    cancelled: bool = False


CallKey = tuple[str, str, str]
"""(caller's SPIFFE ID, JSON type of the id, the id): ``1`` and ``"1"`` are two ids."""


def call_key(peer_id: str, request_id: str | int) -> CallKey:
    """The table's key of a call."""
    kind = "number" if isinstance(request_id, int) else "string"
    return (peer_id, kind, str(request_id))


class RunningCalls:
    """Running calls by caller and JSON-RPC id (see the module)."""

    def __init__(self) -> None:
        self._calls: dict[CallKey, list[RunningCall]] = {}

    def __len__(self) -> int:
        return sum(len(calls) for calls in self._calls.values())

    @contextmanager
    def running(self, key: CallKey, task: asyncio.Task[object]) -> Iterator[RunningCall]:
        """Register ``task`` as serving the call ``key`` while the block runs."""
        entry = RunningCall(task)
        self._calls.setdefault(key, []).append(entry)
        try:
            yield entry
        finally:
            calls = self._calls[key]
            calls.remove(entry)
            if not calls:
                del self._calls[key]

    def cancel(self, key: CallKey) -> bool:
        """Cancel the one call ``key`` names; False if none or more than one runs."""
        calls = self._calls.get(key, [])
        if len(calls) != 1 or calls[0].cancelled:
            return False
        calls[0].cancelled = True
        calls[0].task.cancel(CANCELLED_BY_CLIENT)
        return True
