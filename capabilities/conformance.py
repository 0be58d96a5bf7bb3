"""``tck.conformance``: the A2A TCK's scenarios, written with the public capability API only.

Not loaded by default: list ``"capabilities.conformance"`` in ``modules`` (and,
for the kit, ``[a2a] default_capability = "tck.conformance"``). It routes on
the message id's prefix (``tck-<scenario>-...``) exactly as the kit's
reference agent (``sut/a2a-python/sut_agent.py`` of a2aproject/a2a-tck) does,
so that every scenario the kit sends is expressed by what a capability can say:
artifacts of text, file, URL and data parts (``TaskReply``), a Message answer
(``MessageReply``), a question (``ctx.ask_input``) whose answer is routed on
its own message id, streamed text chunks (``ctx.emit_chunk``), and a failure.
It takes any part (files of every media type, URLs, data objects, text) and
keeps nothing.
"""

from __future__ import annotations

import asyncio

from capabilities.context import CallContext
from capabilities.contract import Accepts, Gives
from capabilities.parts import (
    AnyObject,
    Artifact,
    DataPart,
    FilePart,
    MessageReply,
    Part,
    TaskReply,
    TextPart,
    UrlPart,
)
from capabilities.registry import capability

NAME = "tck.conformance"
QUESTION = "The TCK scenario asks for more input"
"""What a task waiting in ``tck-input-required`` shows as its status message."""
RESUBSCRIBE_SECONDS = 4.0
"""How long ``test-resubscribe-message-id`` works (the reference agent's sleep)."""


class ScenarioRejected(Exception):
    """``tck-reject-task``: the scenario's agent refuses the task (the task fails)."""


def _text(text: str) -> TaskReply:
    return TaskReply(artifacts=(Artifact((TextPart(text),)),))


def _artifact(part: Part) -> TaskReply:
    return TaskReply(artifacts=(Artifact((part,)),))


_FILE = FilePart(b"tck", "text/plain", "output.txt")
_ANSWERS: tuple[tuple[str, TaskReply | MessageReply], ...] = (
    ("tck-stream-artifact-text", _text("Streamed text content")),
    ("tck-stream-artifact-file", _artifact(_FILE)),
    ("tck-stream-ordering-001", _text("Ordered output")),
    (
        "tck-artifact-file-url",
        _artifact(UrlPart("https://example.com/output.txt", "text/plain", "output.txt")),
    ),
    ("tck-message-response", MessageReply((TextPart("Direct message response"),))),
    ("tck-complete-task", TaskReply(text="Hello from TCK")),
    ("tck-artifact-text", _text("Generated text content")),
    ("tck-artifact-file", _artifact(_FILE)),
    ("tck-artifact-data", _artifact(DataPart({"key": "value", "count": 42}))),
    ("tck-stream-001", _text("Stream hello from TCK")),
    ("tck-stream-002", TaskReply()),
    ("tck-stream-003", _text("Stream task lifecycle")),
)
"""Scenarios answered at once, in the reference agent's order (the first prefix wins)."""


@capability(
    NAME,
    "1.0.0",
    risk="read",
    timeout=120.0,
    idempotent=True,
    asks_input=True,
    accepts=Accepts(data=True, text=True, files=("*/*",), urls=True, max_parts=64),
    gives=Gives(data=True, text=True, files=("*/*",), urls=True, tasks=True, messages=True),
)
async def conformance(inp: AnyObject, ctx: CallContext) -> TaskReply | MessageReply:
    """The A2A TCK's reference scenarios, chosen by the message id's prefix."""
    message_id = ctx.message_id
    while True:
        if message_id.startswith("tck-input-required"):
            answer = await ctx.ask_input(QUESTION)
            message_id = answer.message_id  # the answer picks the next scenario
            continue
        return await _scenario(message_id, ctx)


async def _scenario(message_id: str, ctx: CallContext) -> TaskReply | MessageReply:
    if message_id.startswith("tck-stream-artifact-chunked"):
        await ctx.emit_chunk("chunk-1 ")
        await ctx.emit_chunk("chunk-2")
        return TaskReply()
    if message_id.startswith("test-resubscribe-message-id"):
        await asyncio.sleep(RESUBSCRIBE_SECONDS)
        return TaskReply()
    if message_id.startswith("tck-reject-task"):
        raise ScenarioRejected("rejected")
    for prefix, reply in _ANSWERS:
        if message_id.startswith(prefix):
            return reply
    return TaskReply(text=f"Unhandled messageId prefix: {message_id}")
