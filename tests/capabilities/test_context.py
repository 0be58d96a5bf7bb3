"""What a capability's ``ctx`` hands on to a watching caller."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from capabilities.context import MAX_PROGRESS_CHARS, AskState, CallContext
from capabilities.parts import Part


class _Recorded:
    def __init__(self) -> None:
        self.progress_texts: list[str] = []

    async def progress(self, text: str) -> None:
        self.progress_texts.append(text)

    async def chunk(self, data: dict[str, Any] | str) -> None:
        raise AssertionError("no chunk expected")

    async def ask(
        self, prompt: tuple[Part, ...], state: AskState, schema: type[BaseModel] | None
    ) -> Any:
        raise AssertionError("no question expected")


async def test_progress_text_is_cut_at_the_cap_on_every_door() -> None:
    events = _Recorded()
    ctx = CallContext("spiffe://a2a.test/agent/bob", "r1", time.monotonic() + 5, events=events)
    await ctx.report_progress("x" * (MAX_PROGRESS_CHARS + 500))
    await ctx.report_progress("short")
    assert [len(text) for text in events.progress_texts] == [MAX_PROGRESS_CHARS, 5]
