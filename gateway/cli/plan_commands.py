"""Commands that run plans: ``run`` (live progress, final table) and ``tasks`` (list, resume,
approve or deny a step waiting for approval).

Exit codes: 0 the task completed, 1 it failed (or a command was refused), 3 it
waits for approval (``tasks --approve TASK_ID STEP_ID`` or ``--deny`` decides).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.config import load_agent_config
from gateway.display import printable
from gateway.errors import PlanInvalid
from gateway.local.regular_files import read_regular_file
from gateway.plans.document.model import parse_plan, resolve_input
from gateway.plans.execution.step_events import StepEvent
from gateway.plans.task import PlanTaskResult, PlanTaskState
from gateway.runtime.agent import Agent

EXIT_TASK_FAILED = 1
EXIT_WAITING_APPROVAL = 3
"""``run`` / ``tasks --resume``: the task stopped in ``waiting-approval``."""


def add_commands(commands: Any) -> None:
    """Register run and tasks."""
    run = commands.add_parser("run", help="run a plan across this agent and its peers")
    run.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    run.add_argument("plan", type=Path, help="plan document (JSON)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument(
        "--show-values",
        action="store_true",
        help="show the values a step waiting for approval would send (default: names, sizes)",
    )
    run.set_defaults(run=_run)

    tasks = commands.add_parser("tasks", help="list checkpointed tasks, or resume one")
    tasks.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    chosen = tasks.add_mutually_exclusive_group()
    chosen.add_argument("--resume", metavar="TASK_ID", help="resume this task")
    chosen.add_argument(
        "--approve",
        nargs=2,
        metavar=("TASK_ID", "STEP_ID"),
        help="approve the step waiting for approval (audited), then resume the task",
    )
    chosen.add_argument(
        "--deny",
        nargs=2,
        metavar=("TASK_ID", "STEP_ID"),
        help="deny the step waiting for approval (audited); the step fails APPROVAL_DENIED",
    )
    tasks.add_argument("--json", action="store_true", help="print JSON")
    tasks.add_argument(
        "--show-values", action="store_true", help="show the values a waiting step would send"
    )
    tasks.set_defaults(run=_tasks)


async def _with_agent(config_path: Path, work: Callable[[Agent], Awaitable[int]]) -> int:
    # The agent is not served: running plans only needs its registry, policy,
    # peer clients and task store (and must not fight a running `serve` for its port).
    agent = Agent(load_agent_config(config_path))
    await agent.open()
    try:
        return await work(agent)
    finally:
        await agent.stop(grace=0)


def _read_plan(path: Path) -> bytes:
    try:
        return read_regular_file(path)
    except OSError as err:
        raise PlanInvalid(f"{path}: plan file unreadable: {err.strerror or err}") from err


async def _run(args: argparse.Namespace) -> int:
    plan = parse_plan(_read_plan(args.plan), str(args.plan))

    async def work(agent: Agent) -> int:
        progress = None if args.json else _print_event
        if progress is not None:
            print(f"{'STEP':<16} {'WHERE':<40} {'STATUS':<10} {'TIME':>9}", flush=True)
        await agent.audit.start()  # local steps are audited like calls
        result = await agent.run(plan, on_event=progress)
        return await _report(agent, result, args)

    return await _with_agent(args.config, work)


async def _tasks(args: argparse.Namespace) -> int:
    async def work(agent: Agent) -> int:
        if args.approve or args.deny or args.resume:
            # A decision is audited before it is taken, and local steps like calls.
            await agent.audit.start()
        if args.approve or args.deny:
            task_id, step_id = args.approve or args.deny
            decided = await agent.plans.decide(task_id, step_id, approve=bool(args.approve))
            print(
                f"step {printable(step_id)} of task {printable(task_id)}: "
                f"{decided.decision.value} by {printable(decided.decided_by)} "
                f"(input sha256 {decided.input_sha256[:16]})",
                file=sys.stderr,
            )
        resume = args.resume or (args.approve or args.deny or [None])[0]
        if resume:
            progress = None if args.json else _print_event
            result = await agent.plans.resume(resume, on_event=progress or _quiet)
            return await _report(agent, result, args)
        listed = await agent.plans.tasks()
        if args.json:
            print(json.dumps([_summary(task) for task in listed], indent=2))
            return 0
        if not listed:
            print("no tasks (a plan run with `a2a-gateway run` makes one)")
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


async def _report(agent: Agent, result: PlanTaskResult, args: argparse.Namespace) -> int:
    values = await _waiting_values(agent, result) if args.show_values else {}
    if args.json:
        summary = _summary(result, with_outputs=True)
        if args.show_values:
            for entry in summary["approvals"]:
                entry["values"] = values.get(entry["step_id"], {})
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        _print_table(result)
        _print_approvals(result, values)
    if result.ok:
        return 0
    if result.state is PlanTaskState.WAITING_APPROVAL:
        waiting = " ".join(printable(a.step_id) for a in result.approvals)
        print(
            f"task waiting-approval: a2a-gateway tasks --config {shlex.quote(str(args.config))} "
            f"--approve {printable(result.task_id)} STEP (or --deny); waiting: {waiting}",
            file=sys.stderr,
        )
        return EXIT_WAITING_APPROVAL
    # The reason and message can quote a peer's refusal: escaped into one line.
    print(
        f"task {result.state.value}: {printable(result.reason)}: {printable(result.message)}",
        file=sys.stderr,
    )
    return EXIT_TASK_FAILED


async def _waiting_values(agent: Agent, result: PlanTaskResult) -> dict[str, dict[str, Any]]:
    """What each waiting step would send, recomputed from the checkpoint (``--show-values``)."""
    if not result.approvals:
        return {}
    stored = await agent.plan_tasks.load(result.task_id)
    outputs = {sid: r.output for sid, r in stored.steps.items()}
    found: dict[str, dict[str, Any]] = {}
    for request in result.approvals:
        try:
            resolved = resolve_input(stored.plan.step(request.step_id).input, outputs)
        except KeyError:
            continue
        found[request.step_id] = {k: resolved[k] for k in request.fields if k in resolved}
    return found


def _print_approvals(result: PlanTaskResult, values: dict[str, dict[str, Any]]) -> None:
    for request in result.approvals:
        print(
            f"  waiting for approval: step {printable(request.step_id)} would call "
            f"{printable(request.capability)} {printable(request.version)} "
            f"(risk {printable(request.risk)}) on {printable(request.where)}"
        )
        shown = values.get(request.step_id, {})
        for name, size in sorted(request.fields.items()):
            value = f" = {printable(json.dumps(shown[name]))}" if name in shown else ""
            print(f"    field {printable(name)}: {size} bytes{value}")
        print(f"    input sha256 {request.input_sha256}")


def _print_table(result: PlanTaskResult) -> None:
    print(f"\ntask {printable(result.task_id)}: {result.state.value} (revision {result.revision})")
    header = f"  {'STEP':<16} {'WHERE':<40} {'STATUS':<10} {'TRIES':>5} {'TIME':>9}"
    print(f"{header}  {'CONFIDENCE':<10}  EVIDENCE")
    for step in result.steps.values():
        digest = printable(step.evidence.sha256[:16] if step.evidence else step.reason)
        where = printable(step.where or "-")
        print(
            f"  {printable(step.step_id):<16} {where:<40} {step.status.value:<10} "
            f"{step.attempts:>5} {step.duration_ms:>7.1f}ms  {step.confidence.value:<10}  {digest}"
        )
        for source in step.sources if len(step.sources) > 1 else ():
            print(
                f"  {'':<16} source: {printable(source.where)} {printable(source.served_version)}"
                f" {printable(source.sha256[:16])}"
            )
        if step.candidates:
            print(f"  {'':<16} sources disagree: {len(step.candidates)} distinct outputs kept")
        for note in step.notes:
            print(f"  {'':<16} note: {printable(note)}")
    for revision in result.revisions:
        print(f"  revision {revision.revision}: {printable(revision.reason)}")
    print(
        f"  confidence {result.confidence.value}, peer calls {result.peer_calls}, "
        f"tool calls {result.tool_calls}, elapsed {result.elapsed_seconds:.3f}s"
    )


def _summary(result: PlanTaskResult, *, with_outputs: bool = False) -> dict[str, Any]:
    steps = {}
    for sid, step in result.steps.items():
        entry = asdict(step)
        entry["replayed"] = entry.pop("remembered")  # the summary's key, as released
        entry["status"] = step.status.value
        entry["confidence"] = step.confidence.value
        entry["evidence"] = [asdict(e) for e in step.all_evidence()]
        entry.pop("sources")
        entry["candidates"] = list(step.candidates)
        if not with_outputs:
            entry.pop("output")
            entry.pop("candidates")
        steps[sid] = entry
    return {
        "task_id": result.task_id,
        "state": result.state.value,
        "revision": result.revision,
        "reason": result.reason,
        "message": result.message,
        "confidence": result.confidence.value,
        "peer_calls": result.peer_calls,
        "tool_calls": result.tool_calls,
        "elapsed_seconds": result.elapsed_seconds,
        "approvals": [asdict(a) for a in result.approvals],
        "revisions": [asdict(r) for r in result.revisions],
        "steps": steps,
    }
