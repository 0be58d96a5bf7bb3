"""Capabilities for long-running A2A task tests: a gate that waits, reports and streams.

``TaskGate.capabilities()`` is for in-process agents; ``register`` (module
loading) gives a served agent ``job.hang``, which waits until cancelled, for
kill-the-process tests; ``job.pause``, which finishes after a moment (a task
to poll); and ``job.watch``, which waits until cancelled and then leaves a
file named after its tag in ``<state_dir>/cancelled/`` (proof, to another
process, that the capability saw its cancellation).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.loading import AgentEnvironment
from capabilities.registry import Capability, CapabilityRegistry, capability


class JobInput(ContractModel):
    tag: str = ""


class JobOutput(ContractModel):
    done: str


@dataclass
class TaskGate:
    """``job.run`` (read) and ``job.write`` (write) wait for ``release``.

    ``job.run`` reports progress and emits one chunk before waiting; ``job.steps``
    reports "step 1", waits for ``next_step``, reports "step 2", then waits; all set
    ``started`` once running, count their runs, and set ``cancelled`` when
    their call is cancelled. ``job.flood`` emits chunks past any cap; ``job.brief``
    waits under a 0.2 s timeout; ``job.chunks`` emits ``{"part": 1}``, waits for
    ``next_step``, emits parts 2 and 3, then waits; ``job.linger``, cancelled,
    sets ``cancelled`` and cleans up until ``next_step`` is set.
    """

    release: asyncio.Event = field(default_factory=asyncio.Event)
    next_step: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    runs: int = 0
    writes: int = 0

    def capabilities(self) -> list[Capability]:
        @capability("job.run", "1.0.0", risk="read", timeout=60.0, idempotent=True)
        async def run(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Report progress, stream a chunk, wait until released."""
            self.runs += 1
            await ctx.report_progress("halfway")
            await ctx.emit_chunk({"part": 1})
            await self._wait()
            return JobOutput(done=inp.tag)

        @capability("job.write", "1.0.0", risk="write", timeout=60.0)
        async def write(inp: JobInput, ctx: CallContext) -> JobOutput:
            """A write that waits until released (counts its runs)."""
            self.writes += 1
            await self._wait()
            return JobOutput(done=inp.tag)

        @capability("job.flood", "1.0.0", risk="read", timeout=60.0)
        async def flood(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Emit 10 KB chunks until the caller's cap stops it."""
            for n in range(100):
                await ctx.emit_chunk({"n": n, "fill": "x" * 10_000})
            return JobOutput(done=inp.tag)

        @capability("job.brief", "1.0.0", risk="read", timeout=0.2)
        async def brief(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Wait until released, under a 0.2 s contract timeout."""
            await self._wait()
            return JobOutput(done=inp.tag)

        @capability("job.steps", "1.0.0", risk="read", timeout=60.0)
        async def steps(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Report two steps, the second once ``next_step`` is set, then wait."""
            self.runs += 1
            await ctx.report_progress("step 1")
            self.started.set()
            await self.next_step.wait()
            await ctx.report_progress("step 2")
            await self._wait()
            return JobOutput(done=inp.tag)

        @capability("job.chatty", "1.0.0", risk="read", timeout=60.0)
        async def chatty(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Report 500 progress texts in a row, then finish a second later."""
            for n in range(1, 501):
                await ctx.report_progress(f"{n}/500")
            await asyncio.sleep(1.0)  # time for the throttled save of the last text
            return JobOutput(done=inp.tag)

        @capability("job.chunks", "1.0.0", risk="read", timeout=60.0)
        async def chunks(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Emit a chunk, two more once ``next_step`` is set, then wait."""
            self.runs += 1
            await ctx.emit_chunk({"part": 1})
            self.started.set()
            await self.next_step.wait()
            await ctx.emit_chunk({"part": 2})
            await ctx.emit_chunk({"part": 3})
            await self._wait()
            return JobOutput(done=inp.tag)

        @capability("job.linger", "1.0.0", risk="read", timeout=60.0)
        async def linger(inp: JobInput, ctx: CallContext) -> JobOutput:
            """Wait until released; cancelled, clean up until ``next_step`` is set."""
            self.runs += 1
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                await self.next_step.wait()
                raise
            return JobOutput(done=inp.tag)

        return [run, write, flood, brief, steps, chatty, chunks, linger]

    async def _wait(self) -> None:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@capability("job.hang", "1.0.0", risk="read", timeout=600.0)
async def hang(inp: JobInput, ctx: CallContext) -> JobOutput:
    """Wait until cancelled (or the process dies)."""
    await asyncio.sleep(600.0)
    return JobOutput(done=inp.tag)


@capability("job.pause", "1.0.0", risk="read", timeout=30.0, idempotent=True)
async def pause(inp: JobInput, ctx: CallContext) -> JobOutput:
    """Finish after half a second: long enough to be seen unfinished."""
    await asyncio.sleep(0.5)
    return JobOutput(done=inp.tag)


def watched(cancelled_dir: Path) -> Capability:
    """``job.watch``: wait until cancelled, then leave ``cancelled_dir/<tag>``."""
    cancelled_dir.mkdir(parents=True, exist_ok=True)

    @capability("job.watch", "1.0.0", risk="read", timeout=600.0)
    async def watch(inp: JobInput, ctx: CallContext) -> JobOutput:
        """Wait until cancelled; say so in a file."""
        try:
            await asyncio.sleep(600.0)
        except asyncio.CancelledError:
            (cancelled_dir / (inp.tag or "untagged")).touch()
            raise
        return JobOutput(done=inp.tag)

    return watch


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Module loading: the built-ins, ``job.hang``, ``job.pause`` and ``job.watch``."""
    from capabilities.builtin import register as builtins

    builtins(registry, env)
    registry.register(hang)
    registry.register(pause)
    registry.register(watched(env.state_dir / "cancelled"))
