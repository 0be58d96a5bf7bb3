"""Plans: a goal broken into steps, checked statically, run across authorized peers."""

from gateway.errors import (
    BudgetExhausted,
    ExpectationFailed,
    NoRoute,
    PlanInvalid,
    TaskNotFound,
)
from gateway.plans.checks import PlanLimits, check_routes, check_structure
from gateway.plans.model import Budget, Expect, Plan, Step, parse_plan, resolve_input

__all__ = [
    "Budget",
    "BudgetExhausted",
    "Expect",
    "ExpectationFailed",
    "NoRoute",
    "Plan",
    "PlanInvalid",
    "PlanLimits",
    "Step",
    "TaskNotFound",
    "check_routes",
    "check_structure",
    "parse_plan",
    "resolve_input",
]
