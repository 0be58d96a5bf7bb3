"""Named points where a test can make this process die with SIGKILL.

Only for the fault tests of plans: when the environment variable
``A2AGW_TEST_CRASH_AT`` names a point, the process kills itself there, exactly
like a crash (no cleanup, no flush). Unset (always, outside those tests), a
point does nothing.

Points of a write attempt to a peer, in order: ``before-checkpoint`` (the peer
is chosen, nothing recorded), ``after-checkpoint-before-send`` (the pin is
durable, nothing sent) and ``after-answer`` (the peer answered, nothing of it
recorded). A kill while the peer holds the call is done from outside.

Point of a step that failed (in the executor): ``after-failure-recorded`` (the
failed result and its failed attempt are checkpointed; neither the revision
nor the task's failure that answers it is).
"""

from __future__ import annotations

import os
import signal

CRASH_AT_ENV = "A2AGW_TEST_CRASH_AT"

BEFORE_CHECKPOINT = "before-checkpoint"
AFTER_CHECKPOINT_BEFORE_SEND = "after-checkpoint-before-send"
AFTER_ANSWER = "after-answer"
AFTER_FAILURE_RECORDED = "after-failure-recorded"


def crash_point(name: str) -> None:
    """Die here with SIGKILL if ``A2AGW_TEST_CRASH_AT`` is ``name``."""
    if os.environ.get(CRASH_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
