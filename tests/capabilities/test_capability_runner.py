"""run_capability: a capability that never suspends runs without a timer; one that does
keeps its timeout, its deadline and cancellation exactly as before."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest

from capabilities.canonical import CanonicalJson
from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, capability
from capabilities.runner import run_capability
from gateway.errors import CapabilityFailed, CapabilityTimeout, DeadlineExceeded


class Text(ContractModel):
    text: str


def _context(seconds: float = 30.0) -> CallContext:
    return CallContext(
        peer_id="spiffe://t/p", request_id="r-1", deadline=time.monotonic() + seconds
    )


def _made(function: Any, *, timeout: float = 5.0) -> Capability:
    made: Capability = capability("test.run", "1.0.0", risk="read", timeout=timeout)(function)
    return made


async def test_a_capability_that_never_suspends_answers_without_a_timer() -> None:
    async def immediate(inp: Text, ctx: CallContext) -> Text:
        return Text(text=inp.text.upper())

    cap = _made(immediate)
    loop = asyncio.get_running_loop()
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]
    result = await run_capability(cap, Text(text="hi"), _context())
    assert result.payload == b'{"text":"HI"}'
    assert len(loop._scheduled) == timers_before  # type: ignore[attr-defined]


async def test_a_capability_that_suspends_gets_every_value_it_awaits() -> None:
    steps: list[str] = []

    async def suspends(inp: Text, ctx: CallContext) -> Text:
        await asyncio.sleep(0)  # a bare yield to the loop
        steps.append("after sleep(0)")
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, "from a future")
        steps.append(await future)
        queue: asyncio.Queue[str] = asyncio.Queue()
        asyncio.get_running_loop().call_soon(queue.put_nowait, "from a queue")
        steps.append(await queue.get())
        return Text(text=inp.text)

    cap = _made(suspends)
    result = await run_capability(cap, Text(text="x"), _context())
    assert result.payload == b'{"text":"x"}'
    assert steps == ["after sleep(0)", "from a future", "from a queue"]


async def test_a_capability_past_its_timeout_is_cancelled_inside() -> None:
    seen: list[str] = []

    async def slow(inp: Text, ctx: CallContext) -> Text:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return inp

    cap = _made(slow, timeout=0.05)
    with pytest.raises(CapabilityTimeout):
        await run_capability(cap, Text(text="x"), _context())
    assert seen == ["cancelled"]


async def test_a_capability_that_suspends_twice_still_times_out() -> None:
    async def slow_later(inp: Text, ctx: CallContext) -> Text:
        await asyncio.sleep(0)
        await asyncio.sleep(30)
        return inp

    cap = _made(slow_later, timeout=0.05)
    with pytest.raises(CapabilityTimeout):
        await run_capability(cap, Text(text="x"), _context())


async def test_the_call_deadline_bounds_a_suspended_capability() -> None:
    async def slow(inp: Text, ctx: CallContext) -> Text:
        await asyncio.sleep(30)
        return inp

    cap = _made(slow, timeout=20.0)
    with pytest.raises(DeadlineExceeded):
        await run_capability(cap, Text(text="x"), _context(seconds=0.05))


async def test_cancelling_the_caller_cancels_a_suspended_capability() -> None:
    started, seen = asyncio.Event(), []

    async def waits(inp: Text, ctx: CallContext) -> Text:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            seen.append("finally")
        return inp

    cap = _made(waits)
    task = asyncio.create_task(run_capability(cap, Text(text="x"), _context()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["finally"]


async def test_an_error_in_the_first_step_is_a_failure_and_no_timer_is_left() -> None:
    async def broken(inp: Text, ctx: CallContext) -> Text:
        raise RuntimeError("boom")

    cap = _made(broken)
    loop = asyncio.get_running_loop()
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]
    with pytest.raises(CapabilityFailed):
        await run_capability(cap, Text(text="x"), _context())
    assert len(loop._scheduled) == timers_before  # type: ignore[attr-defined]


async def test_an_error_after_suspending_is_a_failure() -> None:
    async def broken_later(inp: Text, ctx: CallContext) -> Text:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    cap = _made(broken_later)
    with pytest.raises(CapabilityFailed):
        await run_capability(cap, Text(text="x"), _context())


async def test_the_result_keeps_the_validated_output_with_its_canonical_bytes() -> None:
    async def shout(inp: Text, ctx: CallContext) -> Text:
        return Text(text=inp.text.upper())

    result = await run_capability(_made(shout), Text(text="ab" * 70_000), _context())
    assert result.payload == b'{"text":"' + b"AB" * 70_000 + b'"}'
    assert isinstance(result.payload, CanonicalJson)
    assert result.payload.value == {"text": "AB" * 70_000}
    assert result.evidence_sha256 == hashlib.sha256(result.payload).hexdigest()
