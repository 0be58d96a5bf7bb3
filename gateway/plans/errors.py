"""Plan errors: the plan-specific branch of the one error tree.

Tree (each carries a stable reason code; status by nearest ancestor in
``gateway.errors.STATUS_TABLE``)::

    GatewayError
    ├── BudgetExhausted      INTERNAL                           BUDGET_EXHAUSTED
    ├── NoRoute              INTERNAL                           NO_ROUTE
    ├── ExpectationFailed    INTERNAL                           EXPECTATION_FAILED
    └── ConfigError          FAILED_PRECONDITION
        ├── PlanInvalid                                         PLAN_INVALID
        └── TaskNotFound                                        TASK_NOT_FOUND
"""

from __future__ import annotations

from gateway import errors
from gateway.errors import ConfigError, GatewayError


class PlanInvalid(ConfigError):
    """A plan failed validation or a static check; the message names the step."""

    reason = "PLAN_INVALID"


class TaskNotFound(ConfigError):
    """No checkpointed task has that id."""

    reason = "TASK_NOT_FOUND"


class BudgetExhausted(GatewayError):
    """A task ran out of steps, peer calls or time before it finished."""

    reason = "BUDGET_EXHAUSTED"


class NoRoute(GatewayError):
    """No local capability and no authorized peer can run a step."""

    reason = "NO_ROUTE"


class ExpectationFailed(GatewayError):
    """A step's output does not satisfy the step's ``expect`` condition."""

    reason = "EXPECTATION_FAILED"


PLAN_ERRORS: tuple[type[GatewayError], ...] = (
    PlanInvalid,
    TaskNotFound,
    BudgetExhausted,
    NoRoute,
    ExpectationFailed,
)


def _register_reasons() -> None:
    # gateway.errors indexes reason codes once, at import; classes defined here
    # come later. Until they move into gateway/errors.py, add them to that index
    # so a plan error that crosses the wire maps back to its own class.
    for cls in PLAN_ERRORS:
        errors._BY_REASON.setdefault(cls.reason, cls)


_register_reasons()
