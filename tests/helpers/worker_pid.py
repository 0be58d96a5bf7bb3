"""A capability module for worker tests: ``worker.pid`` answers the serving process's pid.

Loaded by agents run as processes: ``modules = ["tests.helpers.worker_pid"]``.
"""

from __future__ import annotations

import os

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.loading import AgentEnvironment
from capabilities.registry import CapabilityRegistry, capability


class PidInput(ContractModel):
    pass


class PidOutput(ContractModel):
    pid: int


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Register ``worker.pid``."""
    del env

    @capability("worker.pid", "1.0.0", risk="read", timeout=5.0)
    async def pid(inp: PidInput, ctx: CallContext) -> PidOutput:
        """Which worker process served this call."""
        del inp, ctx
        return PidOutput(pid=os.getpid())

    registry.register(pid)
