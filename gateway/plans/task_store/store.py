"""Where plan tasks are checkpointed: the ``TaskStore`` interface both backends implement."""

from __future__ import annotations

from abc import ABC, abstractmethod

from gateway.plans.document.model import Plan
from gateway.plans.execution.approval import ApprovalRequest, Decision
from gateway.plans.task import RevisionRecord, StepResult, TaskState
from gateway.plans.task_store.records import FailedAttempt, StoredTask, Usage, WritePin


class TaskStore(ABC):
    """Durable task checkpoints."""

    @abstractmethod
    async def create(self, task_id: str, plan: Plan, now_ms: int) -> None:
        """Record a new task in state ``created`` at revision 0."""

    @abstractmethod
    async def set_state(
        self,
        task_id: str,
        state: TaskState,
        usage: Usage,
        now_ms: int,
        reason: str,
        message: str,
        *,
        owner: str | None = None,
    ) -> None:
        """Record a state change and the budget used (fenced by ``owner``'s lease if given)."""

    @abstractmethod
    async def record_usage(self, task_id: str, usage: Usage, now_ms: int, *, owner: str) -> None:
        """Checkpoint the budget used (fenced: TaskLeased if ``owner`` lost the lease)."""

    @abstractmethod
    async def revise(
        self, task_id: str, plan: Plan, record: RevisionRecord, *, owner: str | None = None
    ) -> None:
        """Replace the plan with revision ``record.revision`` and record why."""

    @abstractmethod
    async def record_step(
        self,
        task_id: str,
        result: StepResult,
        *,
        owner: str | None = None,
        failed: FailedAttempt | None = None,
    ) -> bool:
        """Store a step result unless a newer revision or a completion is already stored.

        ``failed`` (the attempt ``result`` reports as failed) is remembered in the
        same transaction when the result is stored, so a crash cannot keep one
        without the other.

        Returns True if it was stored.
        """

    @abstractmethod
    async def pin_write(self, task_id: str, pin: WritePin, usage: Usage, *, owner: str) -> None:
        """Durably record where a write attempt goes, with the usage, before it is sent.

        The latest pin of a step revision wins (a write moves only after an answer
        proved nothing ran where it went before). Fenced: TaskLeased if ``owner``
        lost the lease, and then nothing may be sent.
        """

    @abstractmethod
    async def request_approval(self, task_id: str, request: ApprovalRequest, *, owner: str) -> None:
        """Store ``request`` (pending) as the step's latest approval request, replacing
        any older request or decision of that step. Fenced by ``owner``'s lease."""

    @abstractmethod
    async def decide_approval(
        self, task_id: str, step_id: str, decision: Decision, who: str, now_ms: int
    ) -> ApprovalRequest:
        """Approve or deny the step's pending request; returns it as decided.

        Refused (the store is unchanged) while a live lease is held: a decision is
        taken only on a task no process runs.

        Raises:
            TaskNotFound: no such task, or no pending request for ``step_id``.
            TaskLeased: a process is running the task.
        """

    @abstractmethod
    async def take_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> None:
        """Take (or renew) the task's lease for ``owner`` until ``now_ms + seconds``.

        Raises:
            TaskNotFound: no such task.
            TaskLeased: another owner's lease is live.
        """

    @abstractmethod
    async def renew_lease(self, task_id: str, owner: str, now_ms: int, seconds: float) -> bool:
        """Extend ``owner``'s lease; False if it is no longer ``owner``'s."""

    @abstractmethod
    async def release_lease(self, task_id: str, owner: str) -> None:
        """End ``owner``'s lease (nothing if it is not ``owner``'s)."""

    @abstractmethod
    async def load(self, task_id: str) -> StoredTask:
        """The checkpoint of ``task_id``; TaskNotFound if none."""

    @abstractmethod
    async def list(self, limit: int = 100) -> list[StoredTask]:
        """Most recently updated tasks first."""

    @abstractmethod
    def close(self) -> None:
        """Release the store."""
