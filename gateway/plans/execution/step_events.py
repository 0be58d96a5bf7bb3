"""Live progress of a task's steps, as the executor reports it (CLI, demo, observers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepEvent:
    """Live progress of one step (for the CLI and observers).

    Attributes:
        step_id: The step.
        status: ``started``, ``completed``, ``failed``, ``waiting-approval`` or
            ``skipped`` (late result ignored).
        where: Where it ran (empty when it starts).
        duration_ms: Time taken (0 when it starts).
        reason: Reason code (``OK`` unless it failed).
    """

    step_id: str
    status: str
    where: str = ""
    duration_ms: float = 0.0
    reason: str = "OK"


EventSink = Callable[[StepEvent], None]
