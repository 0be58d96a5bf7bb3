"""Which message and context ids a caller's message carries to an upstream.

**Message ids.** The caller's ``message_id`` is sent as it is (an upstream
routing or deduplicating on it sees what the caller chose). The replay check
makes it unique per caller, not across callers: two callers may both send
``m-1``, and the upstream, which sees one client (this agent), would take the
second for a repeat. So each upstream client remembers who sent the last
``REMEMBERED_IDS`` message ids it was sent, and a message id another caller
already sent there gets a random suffix (``m-1:3f2a...``, the caller's id kept
as its prefix, at most 128 characters in all). The memory is one process's: with
``workers`` or replicas two processes may each send one caller's ``m-1``.

**Context ids.** A caller's ``context_id`` is its own (another caller may use
the same text), so it is never sent. The first message of a caller's
conversation goes without one; the upstream's answer names its context, which
is remembered for that caller and context (the last ``REMEMBERED_CONTEXTS``,
per process) and sent with the caller's next messages in the same context, so
the upstream sees one conversation per caller and context, and never joins two
callers' conversations. A follow-up to an upstream task sends that task's
context.
"""

from __future__ import annotations

import uuid
from typing import TypeVar

REMEMBERED_IDS = 65_536
"""Message ids whose sender each upstream client remembers."""
REMEMBERED_CONTEXTS = 16_384
"""Callers' contexts whose upstream context each upstream client remembers."""
MAX_ID_CHARS = 128
"""Longest message id sent (a gateway upstream takes at most this many)."""
_SUFFIX_HEX = 16
_MAX_UPSTREAM_CONTEXT_CHARS = 256
_K = TypeVar("_K")
_V = TypeVar("_V")


class UpstreamIds:
    """The message ids sent to one upstream and the contexts it named, bounded (FIFO)."""

    __slots__ = ("_contexts", "_senders")

    def __init__(self) -> None:
        self._senders: dict[str, str] = {}  # message id -> the caller who sent it
        self._contexts: dict[tuple[str, str], str] = {}  # (caller, its context) -> upstream's

    def message_id(self, caller: str, message_id: str) -> str:
        """The id to send ``caller``'s message ``message_id`` with (a new one for "")."""
        if not message_id:
            return uuid.uuid4().hex
        sender = self._senders.get(message_id)
        if sender is None:
            _remember(self._senders, message_id, caller, REMEMBERED_IDS)
            return message_id
        if sender == caller:
            return message_id
        kept = message_id[: MAX_ID_CHARS - _SUFFIX_HEX - 1]
        return f"{kept}:{uuid.uuid4().hex[:_SUFFIX_HEX]}"

    def context_id(self, caller: str, context_id: str) -> str:
        """The upstream context of ``caller``'s context ``context_id`` ("" if none known)."""
        if not context_id:
            return ""
        return self._contexts.get((caller, context_id), "")

    def remember_context(self, caller: str, context_id: str, upstream_context: str) -> None:
        """Remember that the upstream named ``caller``'s context ``context_id`` so."""
        if not (context_id and upstream_context):
            return
        too_long = len(upstream_context) > _MAX_UPSTREAM_CONTEXT_CHARS
        if too_long or not upstream_context.isprintable():
            return  # not an id to send again
        key = (caller, context_id)
        if self._contexts.get(key) != upstream_context:
            _remember(self._contexts, key, upstream_context, REMEMBERED_CONTEXTS)


def _remember(table: dict[_K, _V], key: _K, value: _V, bound: int) -> None:
    table.pop(key, None)
    table[key] = value
    if len(table) > bound:
        del table[next(iter(table))]  # the oldest
