"""The plan document: a goal broken into steps with dependencies, and its budget.

Example::

    {
      "goal": "find notes about audit logs and store the best title",
      "max_parallel": 4,
      "max_risk": "write",
      "budget": {"max_steps": 10, "max_peer_calls": 20, "max_elapsed_seconds": 30},
      "approval": {"min_risk": "write"},
      "steps": [
        {"id": "search", "capability": "text.search", "version": "^1",
         "input": {"query": "audit", "limit": 1},
         "verify": {"quorum": 2, "compare": ["items.0.id"]}},
        {"id": "store", "capability": "kv.put", "depends_on": ["search"],
         "input": {"key": "best", "value": {"$from": "search.items.0.title"}},
         "expect": {"schema": {"type": "object", "required": ["revision"]}}}
      ]
    }

A value ``{"$from": "STEP.path.to.field"}`` anywhere in a step's input is
replaced by that part of an earlier step's output (list items by index).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from capabilities.contract import CapabilityName, Risk
from capabilities.versions import ConstraintText, VersionConstraint
from gateway.errors import PlanInvalid
from gateway.plans.document.json_paths import PATH_PATTERN, read_path
from gateway.plans.document.schema import SchemaMismatch, check_well_formed

STEP_ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
REFERENCE_KEY = "$from"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


JsonPath = Annotated[str, Field(pattern=PATH_PATTERN, max_length=512)]


class Bounds(_Frozen):
    """An inclusive numeric range; either end may be left open."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Bounds:
        if self.min is None and self.max is None:
            raise ValueError("a range needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("range min is above its max")
        return self


class Expect(_Frozen):
    """What a step's output must satisfy for the step to count as done.

    ``equals`` and ``range`` are deterministic checks: when a step has one and it
    passes, the step's result counts as ``verified`` (``gateway.plans.execution.verification``).

    Attributes:
        json_schema: A JSON Schema (Draft 2020-12, as ``gateway.plans.document.schema``
            applies it) the output must match.
        equals: JSON path in the output → the value it must equal.
        range: JSON path in the output → the bounds its number must lie within.
    """

    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    equals: dict[JsonPath, Any] = Field(default_factory=dict)
    range: dict[JsonPath, Bounds] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _schema_applies(self) -> Expect:
        # Found now, not once the step has run (and a write has happened).
        if self.json_schema is not None:
            try:
                check_well_formed(self.json_schema)
            except SchemaMismatch as err:
                raise ValueError(f"schema is malformed: {err}") from None
        return self

    @property
    def deterministic(self) -> bool:
        """True if the step has an ``equals`` or ``range`` check."""
        return bool(self.equals or self.range)


class Verify(_Frozen):
    """Run a step on several sources and compare their outputs.

    Attributes:
        quorum: Distinct sources (local counts as one) that must answer alike.
        compare: JSON paths to compare (empty: the whole output, by canonical digest).
    """

    quorum: int = Field(ge=2, le=8)
    compare: tuple[JsonPath, ...] = ()


class Approval(_Frozen):
    """Which steps need a person's approval before anything is sent.

    Attributes:
        min_risk: Steps whose route has this risk or above wait for approval.
    """

    min_risk: Risk = Risk.WRITE


class Step(_Frozen):
    """One unit of work.

    Attributes:
        id: Unique in the plan; letters, digits, ``_`` and ``-``.
        capability: Dotted capability name.
        version: Version constraint (``""`` means any).
        input: The step's input; may hold ``{"$from": "step.path"}`` references.
        depends_on: Steps that must complete first.
        max_retries: Retries for transient failures (None: the agent default).
        expect: Condition on the output that decides success.
        verify: Run on several sources and compare (read or idempotent capabilities only).
        on_unverified: What this step does when a step it depends on asked for
            verification and its sources disagree: ``stop`` (default: it does not
            run and the task fails ``UNVERIFIED``) or ``continue``.
        avoid: Peers this step must not run on (set by replanning).
        revision: Task revision at which the step was last changed (set by replanning).
    """

    id: str = Field(pattern=STEP_ID_PATTERN)
    capability: CapabilityName
    version: ConstraintText = ""
    input: dict[str, Any] = Field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    max_retries: int | None = Field(default=None, ge=0, le=10)
    expect: Expect | None = None
    verify: Verify | None = None
    on_unverified: Literal["stop", "continue"] = "stop"
    avoid: tuple[str, ...] = ()
    revision: int = Field(default=0, ge=0)

    @property
    def constraint(self) -> VersionConstraint:
        """The parsed version constraint."""
        return VersionConstraint.parse(self.version)

    @property
    def asks_verification(self) -> bool:
        """True if the step asks for a quorum or has a deterministic check."""
        return self.verify is not None or (self.expect is not None and self.expect.deterministic)

    def references(self) -> Iterator[str]:
        """Every ``$from`` path in the input, in document order."""
        yield from _references(self.input)


class Budget(_Frozen):
    """Limits the executor enforces for the whole task.

    Attributes:
        max_steps: Step executions (a re-run after replanning counts again).
        max_peer_calls: Invoke attempts sent to peers (retries count).
        max_tool_calls: Runs of local capabilities (retries count).
        max_elapsed_seconds: Running time; also the deadline every step inherits.
        max_revisions: How often the planner may revise the remaining plan.
    """

    max_steps: int | None = Field(default=None, ge=1)
    max_peer_calls: int | None = Field(default=None, ge=0)
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_elapsed_seconds: float = Field(default=60.0, gt=0, le=86_400)
    max_revisions: int = Field(default=2, ge=0, le=20)


class Plan(_Frozen):
    """A goal, its steps and how they may run.

    Attributes:
        goal: What the plan is for (never sent to peers).
        steps: The steps; order only breaks ties between ready steps.
        max_parallel: Most steps running at once.
        max_risk: Highest capability risk the task may use (fails closed: ``read``).
        budget: Limits enforced by the executor.
        approval: Steps at or above a risk wait for a person's approval (the agent's
            ``[plans] approval_min_risk`` may require it for every plan).
    """

    goal: str = Field(max_length=4096)
    steps: tuple[Step, ...] = Field(min_length=1)
    max_parallel: int = Field(default=4, ge=1, le=256)
    max_risk: Risk = Risk.READ
    budget: Budget = Field(default_factory=Budget)
    approval: Approval | None = None

    def step(self, step_id: str) -> Step:
        """The step called ``step_id`` (KeyError if none)."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def replace_step(self, step: Step) -> Plan:
        """A copy with the step of the same id replaced."""
        steps = tuple(step if s.id == step.id else s for s in self.steps)
        return self.model_copy(update={"steps": steps})

    def to_json(self) -> str:
        """Canonical JSON text (by alias) that ``parse_plan`` reads back."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)


def parse_plan(text: str | bytes, source: str = "<plan>") -> Plan:
    """Validate a plan document; raises PlanInvalid naming the key (and step) at fault."""
    try:
        return Plan.model_validate_json(text)
    except ValidationError as err:
        raise PlanInvalid(_describe(source, err, text)) from err


def _describe(source: str, err: ValidationError, text: str | bytes) -> str:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # nested past what pydantic parsed: no step ids
        data = None
    lines = []
    for problem in err.errors(include_url=False, include_input=False)[:10]:
        loc = list(problem["loc"])
        where = ".".join(str(part) for part in loc) or "(top level)"
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            step_id = _step_id_at(data, loc[1])
            if step_id:
                where += f" (step {step_id!r})"
        lines.append(f"{source}: {where}: {problem['msg']}")
    return "\n".join(lines)


def _step_id_at(data: Any, index: int) -> str | None:
    steps = data.get("steps") if isinstance(data, dict) else None
    if isinstance(steps, list) and index < len(steps) and isinstance(steps[index], dict):
        value = steps[index].get("id")
        return value if isinstance(value, str) else None
    return None


def _references(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if set(value) == {REFERENCE_KEY}:
            ref = value[REFERENCE_KEY]
            yield ref if isinstance(ref, str) else ""
            return
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)


def reference_step(path: str) -> str:
    """The step id a ``$from`` path reads from (its first segment)."""
    return path.split(".", 1)[0]


def resolve_input(value: Any, outputs: Mapping[str, Any]) -> Any:
    """``value`` with every ``$from`` reference replaced from ``outputs`` (by step id).

    Raises:
        KeyError: the path does not exist in the referenced output.
    """
    if isinstance(value, dict):
        if set(value) == {REFERENCE_KEY}:
            return _follow(str(value[REFERENCE_KEY]), outputs)
        return {key: resolve_input(item, outputs) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve_input(item, outputs) for item in value]
    return value


def _follow(path: str, outputs: Mapping[str, Any]) -> Any:
    step_id, _, rest = path.partition(".")
    current = outputs[step_id]
    if not rest:
        return current
    try:
        return read_path(current, rest)
    except KeyError:
        raise KeyError(path) from None
