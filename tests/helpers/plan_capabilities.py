"""Capabilities for plan fault tests: they count every run and misbehave on demand.

In-process, each peer gets its own :class:`FaultyPeer` (``peer.capabilities()``
registered in its registry); a test sets ``peer.modes[name]`` to make one of the
peer's capabilities hang, return output that violates its contract, or raise.

A plan can be held between two steps by a local ``gate.wait`` step while the
test changes the network: in-process with :class:`Gate`, or, as a capability
module (``modules = ["tests.helpers.plan_capabilities"]`` in the config of an agent run
by the CLI), with files in the agent's state dir (see :func:`register`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.loading import AgentEnvironment
from capabilities.registry import Capability, CapabilityRegistry, capability

Mode = Literal["ok", "hang", "invalid", "raise"]
"""``ok`` answers; ``hang`` waits until cancelled; ``invalid`` returns output that
violates the contract; ``raise`` raises inside the capability."""

WRITE_TIMEOUT = 30.0
"""Contract timeout of ``fault.write`` (longer than any task budget used here)."""

SHORT_TIMEOUT = 0.5
"""Contract timeout of ``fault.brief`` and ``fault.glance``: they time out well inside a
task budget."""


class FaultInput(ContractModel):
    """What to read or write."""

    key: str


class FaultOutput(ContractModel):
    """Which agent answered and how many runs it has seen."""

    key: str
    runs: int


@dataclass
class FaultyPeer:
    """The capabilities of one peer, with counters of what really ran there.

    Attributes:
        modes: How each capability (by name) behaves on its next run; ``ok`` if absent.
        runs: Runs per capability name (counted on entry, before any fault).
        cancelled: Runs cut off by a cancellation (deadline, timeout, shutdown).
        started: Set when any capability starts running.
    """

    modes: dict[str, Mode] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    cancelled: dict[str, int] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def total(self, name: str) -> int:
        """How often ``name`` started running here."""
        return self.runs.get(name, 0)

    async def _serve(self, name: str, key: str) -> FaultOutput:
        self.runs[name] = self.runs.get(name, 0) + 1
        self.started.set()
        mode = self.modes.get(name, "ok")
        try:
            if mode == "hang":
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled[name] = self.cancelled.get(name, 0) + 1
            raise
        if mode == "raise":
            raise RuntimeError("simulated bug inside the capability")
        if mode == "invalid":
            return {"key": key, "runs": "not a number"}  # type: ignore[return-value]
        return FaultOutput(key=key, runs=self.runs[name])

    def capabilities(self) -> list[Capability]:
        """``fault.read`` (read), ``fault.glance`` (read with a short contract timeout),
        ``fault.write`` (idempotent write), ``fault.brief`` (idempotent write with a short
        contract timeout), ``fault.append`` (plain write)."""

        @capability("fault.read", "1.0.0", risk="read", timeout=WRITE_TIMEOUT)
        async def read(inp: FaultInput, ctx: CallContext) -> FaultOutput:
            """Read a key (counts runs)."""
            return await self._serve("fault.read", inp.key)

        @capability("fault.glance", "1.0.0", risk="read", timeout=SHORT_TIMEOUT)
        async def glance(inp: FaultInput, ctx: CallContext) -> FaultOutput:
            """Read a key within half a second (counts runs)."""
            return await self._serve("fault.glance", inp.key)

        @capability("fault.write", "1.0.0", risk="write", timeout=WRITE_TIMEOUT, idempotent=True)
        async def write(inp: FaultInput, ctx: CallContext) -> FaultOutput:
            """Write a key, idempotently (counts runs)."""
            return await self._serve("fault.write", inp.key)

        @capability("fault.brief", "1.0.0", risk="write", timeout=SHORT_TIMEOUT, idempotent=True)
        async def brief(inp: FaultInput, ctx: CallContext) -> FaultOutput:
            """Write a key within half a second, idempotently (counts runs)."""
            return await self._serve("fault.brief", inp.key)

        @capability("fault.append", "1.0.0", risk="write", timeout=WRITE_TIMEOUT)
        async def append(inp: FaultInput, ctx: CallContext) -> FaultOutput:
            """Append to a key, not idempotent (counts runs)."""
            return await self._serve("fault.append", inp.key)

        return [read, glance, write, brief, append]


def faulty_registry(peer: FaultyPeer) -> CapabilityRegistry:
    """A registry holding only ``peer``'s fault capabilities."""
    registry = CapabilityRegistry()
    for cap in peer.capabilities():
        registry.register(cap)
    return registry


class GateInput(ContractModel):
    """Nothing: the gate is opened from outside."""


class GateOutput(ContractModel):
    """The gate opened."""

    opened: bool


@dataclass
class Gate:
    """``gate.wait`` in-process: holds a plan between two steps until ``open`` is set.

    Attributes:
        reached: Set when the gate step starts.
        open: Set by the test to let the gate step complete.
    """

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    open: asyncio.Event = field(default_factory=asyncio.Event)

    def capability(self) -> Capability:
        """The local ``gate.wait`` capability."""

        @capability("gate.wait", "1.0.0", risk="read", timeout=60.0)
        async def gate(inp: GateInput, ctx: CallContext) -> GateOutput:
            """Wait until the test opens the gate."""
            self.reached.set()
            await self.open.wait()
            return GateOutput(opened=True)

        return gate


# --- As a capability module for agents run by the CLI ---


_GATE_SECONDS = 60.0
_POLL_SECONDS = 0.02
REACHED_FILE = "gate-reached"
RELEASE_FILE = "gate-release"


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Register ``gate.wait``: it creates ``<state_dir>/gate-reached``, then waits for
    ``<state_dir>/gate-release`` to exist."""
    reached, release = Path(env.state_dir) / REACHED_FILE, Path(env.state_dir) / RELEASE_FILE

    @capability("gate.wait", "1.0.0", risk="read", timeout=_GATE_SECONDS)
    async def gate(inp: GateInput, ctx: CallContext) -> GateOutput:
        """Wait until the test creates the release file."""
        reached.touch()
        for _ in range(int(_GATE_SECONDS / _POLL_SECONDS)):  # the file comes from another process
            if release.exists():
                return GateOutput(opened=True)
            await asyncio.sleep(_POLL_SECONDS)
        raise TimeoutError(f"{release} never appeared")

    registry.register(gate)
