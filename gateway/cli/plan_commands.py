"""Commands that run plans: ``run`` (live progress, final table) and ``tasks`` (list, resume)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.agent import Agent
from gateway.config import load_agent_config
from gateway.display import printable
from gateway.errors import PlanInvalid
from gateway.plans.executor import StepEvent
from gateway.plans.model import parse_plan
from gateway.plans.task import TaskResult

EXIT_TASK_FAILED = 1


def add_commands(commands: Any) -> None:
    """Register run and tasks."""
    run = commands.add_parser("run", help="run a plan across this agent and its peers")
    run.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    run.add_argument("plan", type=Path, help="plan document (JSON)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.set_defaults(run=_run)

    tasks = commands.add_parser("tasks", help="list checkpointed tasks, or resume one")
    tasks.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    tasks.add_argument("--resume", metavar="TASK_ID", help="resume this task")
    tasks.add_argument("--json", action="store_true", help="print JSON")
    tasks.set_defaults(run=_tasks)


async def _with_agent(config_path: Path, work: Callable[[Agent], Awaitable[int]]) -> int:
    # The agent is not served: running plans only needs its registry, policy,
    # peer clients and task store (and must not fight a running `serve` for its port).
    agent = Agent(load_agent_config(config_path))
    try:
        return await work(agent)
    finally:
        await agent.stop(grace=0)


def _read_plan(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise PlanInvalid(f"{path}: plan file unreadable: {err.strerror or err}") from err


async def _run(args: argparse.Namespace) -> int:
    plan = parse_plan(_read_plan(args.plan), str(args.plan))

    async def work(agent: Agent) -> int:
        progress = None if args.json else _print_event
        if progress is not None:
            print(f"{'STEP':<16} {'WHERE':<40} {'STATUS':<10} {'TIME':>9}", flush=True)
        result = await agent.run(plan, on_event=progress)
        return _report(result, as_json=args.json)

    return await _with_agent(args.config, work)


async def _tasks(args: argparse.Namespace) -> int:
    async def work(agent: Agent) -> int:
        if args.resume:
            progress = None if args.json else _print_event
            return _report(
                await agent.plans.resume(args.resume, on_event=progress or _quiet),
                as_json=args.json,
            )
        listed = await agent.plans.tasks()
        if args.json:
            print(json.dumps([_summary(task) for task in listed], indent=2))
            return 0
        print(f"{'TASK':<34} {'STATE':<13} {'REV':>3} {'STEPS':>5} {'REASON'}")
        for task in listed:
            print(
                f"{printable(task.task_id):<34} {task.state.value:<13} {task.revision:>3} "
                f"{len(task.completed()):>5} {printable(task.reason)}"
            )
        return 0

    return await _with_agent(args.config, work)


def _quiet(event: StepEvent) -> None:
    return None


def _print_event(event: StepEvent) -> None:
    took = f"{event.duration_ms:.1f}ms" if event.status != "started" else ""
    status = event.status if event.reason == "OK" else f"{event.status} {event.reason}"
    step, where, status = printable(event.step_id), printable(event.where), printable(status)
    print(f"{step:<16} {where:<40} {status:<10} {took:>9}", flush=True)


def _report(result: TaskResult, *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(_summary(result, with_outputs=True), indent=2, sort_keys=True))
    else:
        _print_table(result)
    if result.ok:
        return 0
    # The reason and message can quote a peer's refusal: escaped into one line.
    print(
        f"task {result.state.value}: {printable(result.reason)}: {printable(result.message)}",
        file=sys.stderr,
    )
    return EXIT_TASK_FAILED


def _print_table(result: TaskResult) -> None:
    print(f"\ntask {printable(result.task_id)}: {result.state.value} (revision {result.revision})")
    print(f"  {'STEP':<16} {'WHERE':<40} {'STATUS':<10} {'TRIES':>5} {'TIME':>9}  EVIDENCE")
    for step in result.steps.values():
        digest = printable(step.evidence.sha256[:16] if step.evidence else step.reason)
        where = printable(step.where or "-")
        print(
            f"  {printable(step.step_id):<16} {where:<40} {step.status.value:<10} "
            f"{step.attempts:>5} {step.duration_ms:>7.1f}ms  {digest}"
        )
        for note in step.notes:
            print(f"  {'':<16} note: {printable(note)}")
    for revision in result.revisions:
        print(f"  revision {revision.revision}: {printable(revision.reason)}")
    print(f"  peer calls {result.peer_calls}, elapsed {result.elapsed_seconds:.3f}s")


def _summary(result: TaskResult, *, with_outputs: bool = False) -> dict[str, Any]:
    steps = {}
    for sid, step in result.steps.items():
        entry = asdict(step)
        entry["status"] = step.status.value
        if not with_outputs:
            entry.pop("output")
        steps[sid] = entry
    return {
        "task_id": result.task_id,
        "state": result.state.value,
        "revision": result.revision,
        "reason": result.reason,
        "message": result.message,
        "peer_calls": result.peer_calls,
        "elapsed_seconds": result.elapsed_seconds,
        "revisions": [asdict(r) for r in result.revisions],
        "steps": steps,
    }
