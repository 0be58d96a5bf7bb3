"""A run's stored progress: what one run of a task writes to its task store, each write
fenced by the run's lease.

("Progress", not "checkpoint": signed checkpoints are the audit chain's,
``gateway.audit.checkpoint``.) A run (a fresh start or a resume) holds the
task's lease (``gateway.plans.store.lease``) under its owner id. Every write below
names that owner, so a run that lost
its lease to another process cannot record anything, and ``pin_write`` (which
must succeed before a write is sent) cannot let it send a write either.

Usage (steps, peer calls, elapsed time) is written with every step start, step
result, peer call and lease renewal, so a crash loses at most what happened
since the last of those.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.errors import TaskLeased
from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest
from gateway.plans.execution.budget import BudgetMeter
from gateway.plans.store.lease import RENEW_FRACTION
from gateway.plans.store.records import FailedAttempt, WritePin
from gateway.plans.store.store import PlanTaskStore
from gateway.plans.task import PlanTaskState, RevisionRecord, StepResult

_log = logging.getLogger(__name__)


class StoredProgress:
    """The stored progress of one run of one task, every write fenced by its lease."""

    def __init__(
        self,
        store: PlanTaskStore,
        task_id: str,
        owner: str,
        meter: BudgetMeter,
        lease_seconds: float,
    ) -> None:
        self._store = store
        self.task_id = task_id
        self.owner = owner
        self._meter = meter
        self._lease_seconds = lease_seconds

    async def usage(self) -> None:
        """Store the budget used so far."""
        await self._store.record_usage(
            self.task_id, self._meter.usage(), _now_ms(), owner=self.owner
        )

    async def state(self, state: PlanTaskState, reason: str = "OK", message: str = "") -> None:
        """Store a state change (and the usage)."""
        await self._store.set_state(
            self.task_id, state, self._meter.usage(), _now_ms(), reason, message, owner=self.owner
        )

    async def step_result(self, result: StepResult, failed: FailedAttempt | None = None) -> bool:
        """Store a step result (with ``failed``, the attempt it failed, in the same
        transaction) and the usage; True if the result was stored."""
        stored = await self._store.record_step(
            self.task_id, result, owner=self.owner, failed=failed
        )
        await self.usage()
        return stored

    async def revise(self, plan: Plan, record: RevisionRecord) -> None:
        """Store a revision of the plan."""
        await self._store.revise(self.task_id, plan, record, owner=self.owner)

    async def pin_write(
        self, step_id: str, revision: int, where: str, key: str, version: str
    ) -> None:
        """Record where a write attempt goes (and the usage) before it is sent."""
        pin = WritePin(step_id, revision, where, key, version, _now_ms())
        await self._store.pin_write(self.task_id, pin, self._meter.usage(), owner=self.owner)

    async def request_approval(self, request: ApprovalRequest) -> None:
        """Store a step's approval request (it replaces the step's older one)."""
        await self._store.request_approval(self.task_id, request, owner=self.owner)

    async def renew(self) -> bool:
        """Extend the lease and store the usage; False if the lease is lost."""
        if not await self._store.renew_lease(
            self.task_id, self.owner, _now_ms(), self._lease_seconds
        ):
            return False
        await self.usage()
        return True

    async def keep_lease(self, on_lost: Callable[[], None]) -> None:
        """Renew the lease (and the usage) every third of its life until cancelled;
        call ``on_lost`` and return once it is lost."""
        while True:
            await asyncio.sleep(self._lease_seconds * RENEW_FRACTION)
            try:
                kept = await self.renew()
            except TaskLeased:
                kept = False
            except Exception as err:
                # The store failed this once (e.g. busy): the lease outlives a few
                # missed renewals, and if it lapses and is taken over, the fence on
                # every later write stops this run anyway.
                _log.warning("task %s: lease renewal failed: %s", self.task_id, type(err).__name__)
                continue
            if not kept:
                on_lost()
                return


def _now_ms() -> int:
    return int(time.time() * 1000)
