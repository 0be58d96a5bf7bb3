"""The agent-facing side of plans: run, start, resume, cancel and list tasks.

A task runs in at most one process at a time: before running (or resuming) it,
the runner takes the task's lease in the task store under its owner id, and
gives it back when the run ends. A resume while another process holds a live
lease ends with ``TaskLeased``.

``decide`` approves or denies a step that waits for approval: the decision is
written to the agent's audit log first (it fails closed if the log is down),
then to the task store; resuming the task then acts on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.audit import AuditLog
from gateway.errors import AuditUnavailable, TaskNotFound, UserNotAuthorized
from gateway.identity.exchange import ActingFor
from gateway.local.process_owner import new_owner_id
from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest, Decision, audit_record, local_decider
from gateway.plans.execution.executor import ExecutorParts, TaskExecutor
from gateway.plans.execution.step_events import EventSink, StepEvent
from gateway.plans.store.records import StoredPlanTask
from gateway.plans.store.resume_point import stored_result
from gateway.plans.task import PlanTaskResult

_Prepare = Callable[[], Awaitable[StoredPlanTask]]


def _ignore(event: StepEvent) -> None:
    return None


@dataclass
class TaskHandle:
    """A task running in the background.

    Attributes:
        task_id: The task's id (valid at once; the task is checkpointed under it).
    """

    task_id: str
    _future: asyncio.Task[PlanTaskResult]
    _cancel: asyncio.Event = field(default_factory=asyncio.Event)

    def cancel(self) -> None:
        """Ask the task to stop; its in-flight peer calls are cancelled."""
        self._cancel.set()

    async def result(self) -> PlanTaskResult:
        """Wait for the task to end."""
        return await asyncio.shield(self._future)


class PlanDriver:
    """Runs plans for one agent and keeps track of the ones in flight."""

    def __init__(self, parts: ExecutorParts, decisions: AuditLog | None = None) -> None:
        self._parts = parts
        self._decisions = decisions
        self._running: dict[str, TaskHandle] = {}
        self.owner = new_owner_id()
        """This runner's lease owner id (``host:pid:nonce``)."""

    async def run(
        self,
        plan: Plan,
        *,
        task_id: str | None = None,
        on_event: EventSink = _ignore,
        acting_for: ActingFor | None = None,
    ) -> PlanTaskResult:
        """Run ``plan`` as a new task to its end; returns the typed result."""
        handle = self.start(plan, task_id=task_id, on_event=on_event, acting_for=acting_for)
        return await handle.result()

    def start(
        self,
        plan: Plan,
        *,
        task_id: str | None = None,
        on_event: EventSink = _ignore,
        acting_for: ActingFor | None = None,
    ) -> TaskHandle:
        """Start ``plan`` as a new task in the background.

        ``acting_for``: the user the task acts for (a verified user and its
        token): every step sent to a peer carries a token for that user made
        for that peer (``gateway.identity.exchange``), or is not sent.
        """
        task_id = task_id or uuid.uuid4().hex

        async def create() -> StoredPlanTask:
            await self._parts.store.create(
                task_id, plan, int(time.time() * 1000), _user_key(acting_for)
            )
            return await self._parts.store.load(task_id)

        return self._launch(task_id, create, on_event, acting_for)

    async def resume(
        self, task_id: str, *, on_event: EventSink = _ignore, acting_for: ActingFor | None = None
    ) -> PlanTaskResult:
        """Resume a checkpointed task (a finished one just returns its result)."""
        return await self.start_resume(task_id, on_event=on_event, acting_for=acting_for).result()

    def start_resume(
        self, task_id: str, *, on_event: EventSink = _ignore, acting_for: ActingFor | None = None
    ) -> TaskHandle:
        """Resume ``task_id`` in the background (``acting_for``: as for :meth:`start`)."""
        running = self._running.get(task_id)
        if running is not None:
            return running

        async def load() -> StoredPlanTask:
            return await self._parts.store.load(task_id)

        return self._launch(task_id, load, on_event, acting_for)

    async def decide(
        self, task_id: str, step_id: str, *, approve: bool, who: str | None = None
    ) -> ApprovalRequest:
        """Approve or deny ``step_id`` of a task waiting for approval; returns the decision.

        Raises:
            TaskNotFound: no such task, or that step does not wait for approval.
            TaskLeased: a process is running the task.
            AuditUnavailable: the decision could not be audited (it is not taken).
        """
        stored = await self._parts.store.load(task_id)
        pending = stored.approvals.get(step_id)
        if pending is None or pending.decision is not Decision.PENDING:
            raise TaskNotFound(f"task {task_id} has no step {step_id!r} waiting for approval")
        who = who or local_decider()
        if self._decisions is None:
            raise AuditUnavailable("no audit log to record the decision in")
        record = audit_record(self._parts.agent_id, task_id, pending, approved=approve, who=who)
        await self._decisions.record_durable(record)
        decision = Decision.APPROVED if approve else Decision.DENIED
        return await self._parts.store.decide_approval(
            task_id, step_id, decision, who, int(time.time() * 1000)
        )

    def cancel(self, task_id: str) -> bool:
        """Cancel a task running here; False if it is not running."""
        handle = self._running.get(task_id)
        if handle is None:
            return False
        handle.cancel()
        return True

    async def tasks(self, limit: int = 100) -> list[PlanTaskResult]:
        """Checkpointed tasks, most recently updated first."""
        return [stored_result(stored) for stored in await self._parts.store.list(limit)]

    async def shutdown(self) -> None:
        """Stop every running task without ending it: each stays resumable."""
        handles = list(self._running.values())
        for handle in handles:
            handle._future.cancel()
        for handle in handles:
            with contextlib.suppress(asyncio.CancelledError):
                await handle._future
        self._running.clear()

    def _launch(
        self,
        task_id: str,
        prepare: _Prepare,
        on_event: EventSink,
        acting_for: ActingFor | None = None,
    ) -> TaskHandle:
        cancel = asyncio.Event()

        async def body() -> PlanTaskResult:
            store = self._parts.store
            try:
                stored = await prepare()
                if stored.state.terminal:
                    return stored_result(stored)
                check_same_user(stored, acting_for)
                now_ms = int(time.time() * 1000)
                await store.take_lease(
                    task_id, self.owner, now_ms, self._parts.limits.lease_seconds
                )
                try:
                    stored = await store.load(task_id)  # as of the lease: nobody else runs it now
                    if stored.state.terminal:
                        return stored_result(stored)
                    executor = TaskExecutor(self._parts, stored, on_event, self.owner, acting_for)
                    return await executor.run(cancel)
                finally:
                    await asyncio.shield(store.release_lease(task_id, self.owner))
            finally:
                self._running.pop(task_id, None)

        handle = TaskHandle(task_id, asyncio.create_task(body()), cancel)
        self._running[task_id] = handle
        return handle


def _user_key(acting_for: ActingFor | None) -> tuple[str, str]:
    """(subject, issuer) of the user a task acts for, or two empty strings."""
    if acting_for is None:
        return "", ""
    return acting_for.user.subject, acting_for.user.issuer


def check_same_user(stored: StoredPlanTask, acting_for: ActingFor | None) -> None:
    """Refuse to run ``stored`` for another user than the one it was started for.

    A task started for a user resumes only for that user (a fresh token of
    theirs); one started for no user resumes for none. Its user is kept
    (subject and issuer, never a token) when it is created.

    Raises:
        UserNotAuthorized: the user given is not the task's.
    """
    wanted = (stored.on_behalf_of, stored.user_issuer)
    given = _user_key(acting_for)
    if given == wanted:
        return
    if not wanted[0]:
        raise UserNotAuthorized(f"task {stored.task_id} acts for no user: resume it without one")
    raise UserNotAuthorized(
        f"task {stored.task_id} acts for a user: resume it with acting_for that user"
    )
