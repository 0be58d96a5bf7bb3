"""A capability module for plan crash tests: a plain write that counts every real run.

``ledger.write`` (risk ``write``, not idempotent) appends its entry to
``ledger.log`` in the agent's state folder (flushed and fsynced, so the count
survives any kill) as the first thing it does. If ``ledger-hold`` exists in the
state folder, it then holds the call (the caller waits) until ``ledger-release``
appears or the call's deadline passes: a test kills the calling agent while the
peer holds the call.

``ledger.peek`` (risk ``read``) counts its runs in ``peek.log`` and answers how
many entries the ledger holds. While ``ledger-fail`` exists in the state folder,
both capabilities fail (``CAPABILITY_FAILED``) after counting their run. Loaded
by agents run as processes: ``modules = ["tests.helpers.ledger_write"]``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.loading import AgentEnvironment
from capabilities.registry import CapabilityRegistry, capability

LOG_NAME = "ledger.log"
HOLD_FILE = "ledger-hold"
RELEASE_FILE = "ledger-release"
FAIL_FILE = "ledger-fail"
PEEK_LOG_NAME = "peek.log"
_POLL_SECONDS = 0.02


class LedgerInput(ContractModel):
    """What to write."""

    entry: str


class LedgerOutput(ContractModel):
    """How many entries the ledger holds after this one."""

    entries: int


def ledger_entries(state_dir: Path) -> list[str]:
    """Every entry written so far (one per real run of the capability)."""
    path = state_dir / LOG_NAME
    return path.read_text().splitlines() if path.exists() else []


def peek_runs(state_dir: Path) -> int:
    """Real runs of ``ledger.peek`` so far."""
    path = state_dir / PEEK_LOG_NAME
    return len(path.read_text().splitlines()) if path.exists() else 0


class LedgerFailed(RuntimeError):
    """The capability ran and then failed, as told by the fail file."""


def _append(path: Path, entry: str) -> int:
    with path.open("a") as handle:
        handle.write(entry + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return len(path.read_text().splitlines())


async def _released(release: Path, ctx: CallContext) -> None:
    # The release file comes from another process: polling is the only way to see it.
    for _ in range(int(max(0.0, ctx.time_remaining()) / _POLL_SECONDS) + 1):
        if await asyncio.to_thread(release.exists):
            return
        await asyncio.sleep(_POLL_SECONDS)


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Register ``ledger.write`` writing into ``env.state_dir``."""
    state = Path(env.state_dir)

    @capability("ledger.write", "1.0.0", risk="write", timeout=60.0)
    async def write(inp: LedgerInput, ctx: CallContext) -> LedgerOutput:
        """Append an entry durably; hold the call while the hold file exists."""
        count = await asyncio.to_thread(_append, state / LOG_NAME, inp.entry)
        if await asyncio.to_thread((state / FAIL_FILE).exists):
            raise LedgerFailed("told to fail after writing")
        if await asyncio.to_thread((state / HOLD_FILE).exists):
            await _released(state / RELEASE_FILE, ctx)
        return LedgerOutput(entries=count)

    @capability("ledger.peek", "1.0.0", risk="read", timeout=60.0)
    async def peek(inp: LedgerInput, ctx: CallContext) -> LedgerOutput:
        """Count this run; answer how many entries the ledger holds."""
        await asyncio.to_thread(_append, state / PEEK_LOG_NAME, inp.entry)
        if await asyncio.to_thread((state / FAIL_FILE).exists):
            raise LedgerFailed("told to fail")
        return LedgerOutput(entries=len(ledger_entries(state)))

    registry.register(write)
    registry.register(peek)
