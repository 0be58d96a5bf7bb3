"""Capabilities for the MCP interop tests, loaded by a served agent (``modules``).

``register`` gives the built-ins, ``mcp.steps`` (three progress reports, then
done) and ``mcp.watch`` (one progress report, then waits until cancelled and
leaves ``<state_dir>/cancelled/<tag>``: proof, to another process, that the
capability saw its cancellation).
"""

from __future__ import annotations

import asyncio

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.loading import AgentEnvironment
from capabilities.registry import CapabilityRegistry, capability


class Tagged(ContractModel):
    tag: str = ""


class Done(ContractModel):
    done: str


@capability("mcp.steps", "1.0.0", risk="read", timeout=30.0)
async def steps(inp: Tagged, ctx: CallContext) -> Done:
    """Report three steps, then finish."""
    for number in (1, 2, 3):
        await ctx.report_progress(f"step {number}")
        await asyncio.sleep(0.05)
    return Done(done=inp.tag)


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Module loading: the built-ins, ``mcp.steps`` and ``mcp.watch``."""
    from capabilities.builtin import register as builtins

    builtins(registry, env)
    registry.register(steps)
    cancelled = env.state_dir / "cancelled"
    cancelled.mkdir(parents=True, exist_ok=True)

    @capability("mcp.watch", "1.0.0", risk="read", timeout=60.0)
    async def watch(inp: Tagged, ctx: CallContext) -> Done:
        """Report that it started, then wait until cancelled; say so in a file."""
        await ctx.report_progress("started")
        try:
            await asyncio.sleep(60.0)
        except asyncio.CancelledError:
            (cancelled / (inp.tag or "untagged")).touch()
            raise
        return Done(done=inp.tag)

    registry.register(watch)
