"""A capability module for crash tests: a write whose side effect lands before its answer.

``notes.append`` appends its note to ``appends.log`` in the agent's state folder
(flushed and fsynced, so it survives SIGKILL), then, the first time a note is
seen, lingers until the call's deadline: the test kills the agent inside that
window, after the side effect and before any answer or idempotency record.
Later calls with the same note return at once, so a retry after a restart is
quick. Loaded by agents run as processes: ``modules = ["tests.helpers.crash_window"]``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.loading import AgentEnvironment
from capabilities.registry import CapabilityRegistry, capability

LOG_NAME = "appends.log"


class AppendInput(ContractModel):
    note: str


class AppendOutput(ContractModel):
    appended: int


def appended_lines(state_dir: Path) -> list[str]:
    """Every note appended so far (one per real run of the capability)."""
    path = state_dir / LOG_NAME
    return path.read_text().splitlines() if path.exists() else []


def _append(path: Path, note: str) -> int:
    with path.open("a") as handle:
        handle.write(note + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return len(path.read_text().splitlines())


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Register ``notes.append`` writing into ``env.state_dir``."""
    path = env.state_dir / LOG_NAME

    @capability("notes.append", "1.0.0", risk="write", timeout=60.0, idempotent=True)
    async def append(inp: AppendInput, ctx: CallContext) -> AppendOutput:
        """Append a note durably; the first run of a note lingers until the deadline."""
        first = inp.note not in appended_lines(env.state_dir)
        count = await asyncio.to_thread(_append, path, inp.note)
        if first:
            await asyncio.sleep(max(0.0, ctx.time_remaining() - 0.5))
        return AppendOutput(appended=count)

    registry.register(append)
