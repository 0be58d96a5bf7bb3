"""Capabilities that take parts, answer with replies and ask for input (A2A conversation tests).

``Conversations`` records what reached them (``seen``), so a test can assert
what a capability got and that a refused message never reached it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from capabilities import (
    Accepts,
    Answer,
    AnyObject,
    Artifact,
    CallContext,
    Capability,
    ContractModel,
    DataPart,
    FilePart,
    Gives,
    MessageReply,
    TaskReply,
    TextPart,
    UrlPart,
    capability,
)

CAPABILITIES = [
    "trip.book",
    "chat.loop",
    "chat.reply",
    "chat.either",
    "doc.words",
    "out.kinds",
    "auth.ask",
    "ask.undeclared",
    "chunks.text",
    "trip.write",
    "ask.local",
]


class TextRequest(ContractModel):
    text: str


class Destination(ContractModel):
    city: str
    nights: int = 1


class WordsInput(ContractModel):
    pass


@dataclass
class Conversations:
    """The capabilities, and what reached them."""

    seen: list[tuple[str, Any]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    writes: int = 0

    def capabilities(self) -> list[Capability]:
        seen = self.seen

        @capability(
            "trip.book",
            "1.0.0",
            risk="read",
            timeout=30.0,
            asks_input=True,
            accepts=Accepts(text=True),
            gives=Gives(text=True, data=True),
        )
        async def book(inp: TextRequest, ctx: CallContext) -> TaskReply:
            """Ask where to, then book it."""
            seen.append(("trip.book", inp.text))
            try:
                where = await ctx.ask_input("Where to?", schema=Destination)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            seen.append(("trip.book answer", where))
            booking = Artifact(
                (TextPart(f"booked {where.city}"), DataPart({"nights": where.nights})),
                name="booking",
            )
            return TaskReply(artifacts=(booking,), text="done")

        @capability(
            "trip.write",
            "1.0.0",
            risk="write",
            timeout=30.0,
            asks_input=True,
            accepts=Accepts(text=True),
            gives=Gives(text=True),
        )
        async def write(inp: TextRequest, ctx: CallContext) -> TaskReply:
            """A write that asks before it writes."""
            where = await ctx.ask_input("Where to?", schema=Destination)
            self.writes += 1
            return TaskReply(artifacts=(Artifact((TextPart(f"wrote {where.city}"),)),))

        @capability(
            "chat.loop",
            "1.0.0",
            risk="read",
            timeout=30.0,
            asks_input=True,
            accepts=Accepts(text=True, files=("text/*",), max_parts=4),
            gives=Gives(text=True, messages=True),
        )
        async def loop(inp: TextRequest, ctx: CallContext) -> TaskReply | MessageReply:
            """Ask for more until told 'done' (or 'message': answer a Message)."""
            seen.append(("chat.loop", (ctx.message_id, ctx.context_id, ctx.parts)))
            said = [inp.text]
            while True:
                answer: Answer = await ctx.ask_input([TextPart(f"got {len(said)}; more?")])
                seen.append(("chat.loop answer", answer))
                if answer.text == "message":
                    return MessageReply((TextPart(" ".join(said)),))
                if answer.text == "done":
                    return TaskReply(artifacts=(Artifact((TextPart(" ".join(said)),)),))
                said.append(answer.text)

        @capability(
            "chat.reply",
            "1.0.0",
            risk="read",
            timeout=5.0,
            idempotent=True,
            accepts=Accepts(text=True),
            gives=Gives(text=True, messages=True, tasks=False),
        )
        async def reply(inp: TextRequest, ctx: CallContext) -> MessageReply:
            """Answer with a Message."""
            seen.append(("chat.reply", inp.text))
            return MessageReply((TextPart(f"hello {inp.text}"),))

        @capability(
            "chat.either",
            "1.0.0",
            risk="read",
            timeout=5.0,
            accepts=Accepts(text=True),
            gives=Gives(text=True, messages=True),
        )
        async def either(inp: TextRequest, ctx: CallContext) -> TaskReply | MessageReply:
            """A Message for 'message', else a task; 'progress' reports first."""
            if inp.text.startswith("progress"):
                await ctx.report_progress("thinking")
            if inp.text.endswith("message"):
                return MessageReply((TextPart("a message"),))
            return TaskReply(artifacts=(Artifact((TextPart("a task"),)),))

        @capability(
            "doc.words",
            "1.0.0",
            risk="read",
            timeout=5.0,
            accepts=Accepts(data=False, text=True, files=("text/*",), max_parts=3),
            gives=Gives(text=True),
        )
        async def words(inp: WordsInput, ctx: CallContext) -> TaskReply:
            """Count the words of the text files it is given."""
            seen.append(("doc.words", ctx.parts))
            counts = [
                TextPart(f"{part.name}: {len(part.data.split())} words")
                for part in ctx.parts
                if isinstance(part, FilePart)
            ]
            return TaskReply(artifacts=(Artifact(tuple(counts), name="counts"),))

        @capability(
            "out.kinds",
            "1.0.0",
            risk="read",
            timeout=5.0,
            accepts=Accepts(text=True),
            gives=Gives(text=True, files=("text/plain",), urls=True),
        )
        async def kinds(inp: TextRequest, ctx: CallContext) -> TaskReply:
            """Answer with one artifact of each kind ('image' tries a file it may not give)."""
            media = "image/png" if inp.text == "image" else "text/plain"
            return TaskReply(
                artifacts=(
                    Artifact((TextPart("Generated text content"),), name="text"),
                    Artifact((FilePart(b"tck", media, "output.txt"),), name="file"),
                    Artifact((UrlPart("https://example.com/output.txt", "text/plain", "o.txt"),)),
                    Artifact((DataPart({"key": "value", "count": 42}),)),
                ),
                text="four artifacts",
            )

        @capability(
            "auth.ask",
            "1.0.0",
            risk="read",
            timeout=30.0,
            asks_input=True,
            accepts=Accepts(text=True),
            gives=Gives(text=True),
        )
        async def ask_auth(inp: TextRequest, ctx: CallContext) -> TaskReply:
            """Ask for authorization (the caller's answer continues it)."""
            answer = await ctx.ask_input("Authorize the transfer", state="auth-required")
            return TaskReply(artifacts=(Artifact((TextPart(f"authorized: {answer.text}"),)),))

        @capability("ask.undeclared", "1.0.0", risk="read", timeout=5.0)
        async def undeclared(inp: AnyObject, ctx: CallContext) -> AnyObject:
            """Asks for input although its contract does not say it may."""
            await ctx.ask_input("anything?")
            return AnyObject()

        @capability(
            "chunks.text",
            "1.0.0",
            risk="read",
            timeout=5.0,
            accepts=Accepts(text=True),
            gives=Gives(text=True),
        )
        async def text_chunks(inp: TextRequest, ctx: CallContext) -> TaskReply:
            """Stream two text chunks and a data chunk, then answer."""
            await ctx.emit_chunk("chunk-1 ")
            await ctx.emit_chunk("chunk-2")
            await ctx.emit_chunk({"n": 3})
            return TaskReply()

        class Local(ContractModel):  # no module names it: only this process can check it
            yes: bool

        @capability("ask.local", "1.0.0", risk="read", timeout=30.0, asks_input=True)
        async def ask_local(inp: AnyObject, ctx: CallContext) -> AnyObject:
            """Ask with a schema only this process can name."""
            await ctx.ask_input("sure?", schema=Local)
            return AnyObject()

        return [
            ask_local,
            book,
            write,
            loop,
            reply,
            either,
            words,
            kinds,
            ask_auth,
            undeclared,
            text_chunks,
        ]
