"""The executor's budget meter: steps, peer calls, tool calls and elapsed time, enforced."""

from __future__ import annotations

import time

from gateway.errors import BudgetExhausted
from gateway.plans.document.model import Budget
from gateway.plans.store.records import Usage


class BudgetMeter:
    """Counts what a task uses and refuses what would exceed its budget.

    Elapsed time is wall time since the task first started: time used before a
    restart (``used.elapsed_seconds``, as of its checkpoint) and time since that
    checkpoint while no process ran the task (``down_seconds``) both count, since
    peers may still be running calls the dead process sent.
    """

    def __init__(self, budget: Budget, used: Usage, down_seconds: float = 0.0) -> None:
        self._budget = budget
        self.steps = used.steps
        self.peer_calls = used.peer_calls
        self.tool_calls = used.tool_calls
        self._prior = used.elapsed_seconds + max(0.0, down_seconds)
        self._started = time.monotonic()
        self.deadline = self._started + max(0.0, budget.max_elapsed_seconds - self._prior)
        """``time.monotonic()`` by which the task must end; every step inherits it."""

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def check_time(self) -> None:
        """BudgetExhausted if no time is left."""
        if self.remaining() <= 0:
            raise BudgetExhausted(
                f"max_elapsed_seconds ({self._budget.max_elapsed_seconds:g}) reached"
            )

    def take_step(self) -> None:
        """Count one step execution, or refuse it."""
        self.check_time()
        limit = self._budget.max_steps
        if limit is not None and self.steps >= limit:
            raise BudgetExhausted(f"max_steps ({limit}) reached")
        self.steps += 1

    def take_peer_call(self) -> None:
        """Count one call to a peer, or refuse it."""
        self.check_time()
        limit = self._budget.max_peer_calls
        if limit is not None and self.peer_calls >= limit:
            raise BudgetExhausted(f"max_peer_calls ({limit}) reached")
        self.peer_calls += 1

    def take_tool_call(self) -> None:
        """Count one run of a local capability, or refuse it."""
        self.check_time()
        limit = self._budget.max_tool_calls
        if limit is not None and self.tool_calls >= limit:
            raise BudgetExhausted(f"max_tool_calls ({limit}) reached")
        self.tool_calls += 1

    def usage(self) -> Usage:
        """What has been used, for the checkpoint."""
        elapsed = self._prior + (time.monotonic() - self._started)
        return Usage(self.steps, self.peer_calls, elapsed, self.tool_calls)
