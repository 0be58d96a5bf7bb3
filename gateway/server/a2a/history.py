"""A task's message history, kept with the task for a capability that asks for input.

Only a capability whose contract declares ``asks_input`` has its task keep
messages: the message that started it, each prompt of ``ctx.ask_input``, each
answer, and the final status message (a ``TaskReply``'s text, a reply's
message). Any other task keeps none: its input is never kept at rest.

The history is canonical JSON, a list of ``{"role", "message_id", "parts"}``
(parts in their :mod:`capabilities.replies` form), oldest first, bounded: at
most :data:`MAX_MESSAGES` messages and :data:`MAX_BYTES` bytes; the oldest
go first, and a message larger than the bound on its own is not kept. GetTask,
ListTasks and SendMessage return its last ``history_length`` messages (all of
it when unset, none for 0, as the spec says).
"""

from __future__ import annotations

from typing import Any

import orjson

from capabilities.canonical import canonical_json

MAX_MESSAGES = 32
"""Most messages a task's history keeps (the newest)."""
MAX_BYTES = 1 << 20
"""Most bytes of canonical JSON a task's history keeps (the newest messages)."""


def appended(history: bytes, role: str, message_id: str, parts: list[dict[str, Any]]) -> bytes:
    """``history`` with one more message, cut to the bounds (oldest first out)."""
    kept = messages(history)
    kept.append({"role": role, "message_id": message_id, "parts": parts})
    sizes = [len(canonical_json(message)) + 1 for message in kept]
    while kept and (len(kept) > MAX_MESSAGES or sum(sizes) + 1 > MAX_BYTES):
        del kept[0], sizes[0]
    return canonical_json(kept) if kept else b""


def messages(history: bytes) -> list[dict[str, Any]]:
    """The kept messages, oldest first (none for an empty history)."""
    if not history:
        return []
    loaded = orjson.loads(history)
    return loaded if isinstance(loaded, list) else []


def last(history: bytes, history_length: int | None) -> list[dict[str, Any]]:
    """The last ``history_length`` messages (all for None, none for 0 or less)."""
    if history_length is not None and history_length <= 0:
        return []
    kept = messages(history)
    return kept if history_length is None else kept[-history_length:]
