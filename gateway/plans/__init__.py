"""Plans: a goal broken into steps, checked statically, run across authorized peers."""

from gateway.errors import (
    ApprovalDenied,
    BudgetExhausted,
    ExpectationFailed,
    NoRoute,
    PlanInvalid,
    Stagnated,
    TaskNotFound,
    Unverified,
)
from gateway.plans.document.checks import PlanLimits, check_routes, check_structure
from gateway.plans.document.model import (
    Approval,
    Budget,
    Expect,
    Plan,
    Step,
    Verify,
    parse_plan,
    resolve_input,
)
from gateway.plans.execution.verification import Confidence

__all__ = [
    "Approval",
    "ApprovalDenied",
    "Budget",
    "BudgetExhausted",
    "Confidence",
    "Expect",
    "ExpectationFailed",
    "NoRoute",
    "Plan",
    "PlanInvalid",
    "PlanLimits",
    "Stagnated",
    "Step",
    "TaskNotFound",
    "Unverified",
    "Verify",
    "check_routes",
    "check_structure",
    "parse_plan",
    "resolve_input",
]
