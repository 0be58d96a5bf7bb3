"""A plan's write killed with SIGKILL at every point of its attempt, then resumed.

alice (the CLI, ``a2a-gateway run``) lists bob and carol as peers; both serve the
counting ``ledger.write`` of ``tests.helpers.ledger_write`` and grant it to
alice, and alice's outbound rules allow it to both; bob comes first. A plan with
one write step starts, alice dies with SIGKILL at one point of the write attempt,
and ``tasks --resume`` runs it again (with bob down, or bob up).

Points (``gateway.plans.execution.crash_points``, set by ``A2AGW_TEST_CRASH_AT``):
``before-checkpoint`` (bob chosen, nothing recorded, nothing sent),
``after-checkpoint-before-send`` (the pin to bob is durable, nothing sent),
``during-run`` (bob holds the call; the test kills alice from outside) and
``after-answer`` (bob answered, nothing of it recorded). Ctrl-C (SIGINT) while
bob holds the call must end the same way as a SIGKILL there.

What must hold, counted where the write really ran (bob's and carol's ledgers):
the write ran at most once in total, exactly once on bob wherever it reached
him, never on carol once it may have reached bob; the resumed task ends with the
exact state and reason below, naming bob when the outcome is unknown.

A step that failed on bob (``ledger.peek`` or ``ledger.write`` raising there while
``ledger-fail`` exists) with alice killed at ``after-failure-recorded`` (the
failure is checkpointed, the revision or the task's failure that answers it is
not) resumes exactly as the run that was not interrupted ends, and sends bob
nothing more for that step.

Every test runs twice: alice's tasks in SQLite (the same process config resumes),
and in PostgreSQL shared by two replicas of alice (the replica that did not run
the plan resumes it after the other was killed).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.plans.execution.attempt_rules import WRITE_IN_DOUBT
from gateway.plans.execution.crash_points import AFTER_FAILURE_RECORDED, CRASH_AT_ENV
from gateway.plans.execution.verification import comparison_digest
from gateway.plans.store.postgres import PostgresPlanTaskStore
from gateway.plans.store.sqlite import FailedAttempt, SqlitePlanTaskStore, StoredPlanTask
from gateway.plans.store.store import PlanTaskStore
from tests.helpers.agent_process import REPO, AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, grant, outbound_rule, spiffe, write_policy
from tests.helpers.ledger_write import (
    FAIL_FILE,
    HOLD_FILE,
    RELEASE_FILE,
    ledger_entries,
    peek_runs,
)
from tests.helpers.postgres import state_pool

BOB, CAROL = spiffe("bob"), spiffe("carol")
CLI_TIMEOUT = 60.0  # python start-up on a busy runner; a hang detector, never asserted
POLL = 0.05
DURING_RUN = "during-run"
CTRL_C = "ctrl-c-during-run"  # SIGINT instead of SIGKILL while bob holds the call
POINTS = ["before-checkpoint", "after-checkpoint-before-send", DURING_RUN, "after-answer", CTRL_C]
HELD = (DURING_RUN, CTRL_C)
LEDGER_CAPS = ["ledger.write", "ledger.peek"]


@dataclass
class Scene:
    alice_config: Path
    alice_state: Path
    bob: AgentProcess
    carol: AgentProcess
    states: dict[str, Path]
    plan: Path
    resume_config: Path
    """Who resumes: alice again, or (PostgreSQL) another replica of alice."""
    open_store: Callable[[], PlanTaskStore]
    bob_audit: Path

    def runs(self) -> dict[str, int]:
        """Real runs of ledger.write on each peer."""
        return {name: len(ledger_entries(state)) for name, state in self.states.items()}


@pytest.fixture(params=["sqlite", "postgres-replicas"])
def scene(request: pytest.FixtureRequest, pki: Pki, tmp_path: Path) -> Iterator[Scene]:
    """bob and carol serving; alice's task state in SQLite, or in PostgreSQL shared by two
    replicas of alice: one runs the plan and is killed, the other resumes it."""
    dsn: str | None = None
    if request.param == "postgres-replicas":
        dsn = request.getfixturevalue("pg_dsn")
    states = {name: tmp_path / f"{name}-state" for name in ("bob", "carol")}
    servers = {}
    for name in ("bob", "carol"):
        policy = write_policy(
            tmp_path / f"{name}-policy.toml", [grant("alice", LEDGER_CAPS, max_risk="write")]
        )
        config = write_agent_toml(
            tmp_path / f"{name}.toml",
            pki,
            name,
            listen="127.0.0.1:0",
            policy=policy,
            audit_db=tmp_path / f"{name}-audit.sqlite",
            state_dir=states[name],
            modules=["tests.helpers.ledger_write"],
        )
        servers[name] = AgentProcess(config)
    try:
        for server in servers.values():
            server.spawn()
        addresses = {name: server.wait_serving() for name, server in servers.items()}
        alice_policy = write_policy(
            tmp_path / "alice-policy.toml",
            [],
            [outbound_rule("bob", LEDGER_CAPS), outbound_rule("carol", LEDGER_CAPS)],
        )
        alice_configs = [
            write_agent_toml(
                tmp_path / f"alice{n}.toml",
                pki,
                "alice",
                listen="127.0.0.1:0",
                policy=alice_policy,
                audit_db=dsn or tmp_path / "alice-audit.sqlite",
                state_dir=tmp_path / f"alice{n}-state",
                peers=[("bob", addresses["bob"]), ("carol", addresses["carol"])],
                state_db=dsn,
            )
            for n in ("", "-replica")
        ]
        alice_state = tmp_path / "alice-state"
        if dsn is None:
            resume_config = alice_configs[0]

            def open_store() -> PlanTaskStore:
                return SqlitePlanTaskStore(alice_state / "tasks.sqlite")
        else:
            resume_config = alice_configs[1]
            shared = dsn

            def open_store() -> PlanTaskStore:
                return PostgresPlanTaskStore(state_pool(shared, "task store"), spiffe("alice"))

        plan = tmp_path / "plan.json"
        step = {"id": "w", "capability": "ledger.write", "input": {"entry": "once"}}
        document = {"goal": "one write", "max_risk": "write", "steps": [step]}
        plan.write_text(json.dumps({**document, "budget": {"max_elapsed_seconds": 60}}))
        yield Scene(
            alice_configs[0],
            alice_state,
            servers["bob"],
            servers["carol"],
            states,
            plan,
            resume_config,
            open_store,
            tmp_path / "bob-audit.sqlite",
        )
    finally:
        for server in servers.values():
            server.ensure_stopped()


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli.main", *args]


def run_to_the_end(scene: Scene) -> tuple[int, dict[str, Any], str]:
    """``a2a-gateway run`` the plan, uninterrupted: exit code, result, stderr."""
    done = subprocess.run(
        cli("run", "--config", str(scene.alice_config), str(scene.plan), "--json"),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=CLI_TIMEOUT,
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def run_until_killed(scene: Scene, point: str) -> None:
    """``a2a-gateway run`` the plan and let it die with SIGKILL (or SIGINT) at ``point``."""
    env = dict(os.environ)
    if point in HELD:
        (scene.states["bob"] / HOLD_FILE).touch()
    else:
        env[CRASH_AT_ENV] = point
    proc = subprocess.Popen(
        cli("run", "--config", str(scene.alice_config), str(scene.plan), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        if point in HELD:
            for _ in range(int(CLI_TIMEOUT / POLL)):  # bounded: until bob holds the call
                if scene.runs()["bob"] or proc.poll() is not None:
                    break
                time.sleep(POLL)
            assert scene.runs()["bob"] == 1, proc.communicate(timeout=CLI_TIMEOUT)
            os.kill(proc.pid, signal.SIGINT if point == CTRL_C else signal.SIGKILL)
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=CLI_TIMEOUT)
    if point != CTRL_C:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, out, err)
    else:
        assert proc.returncode != 0, (out, err)


def resume(scene: Scene, task_id: str) -> tuple[int, dict[str, Any], str]:
    """``a2a-gateway tasks --resume TASK_ID --json``: exit code, result, stderr."""
    done = subprocess.run(
        cli("tasks", "--config", str(scene.resume_config), "--resume", task_id, "--json"),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=CLI_TIMEOUT,
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def stored(scene: Scene) -> StoredPlanTask:
    """alice's only task, as checkpointed."""

    async def load() -> StoredPlanTask:
        store = scene.open_store()
        try:
            [task] = await store.list()
            return await store.load(task.task_id)
        finally:
            store.close()

    return asyncio.run(load())


def crash(scene: Scene, point: str) -> StoredPlanTask:
    """Run the plan, kill alice at ``point``; returns the checkpoint she left."""
    run_until_killed(scene, point)
    task = stored(scene)
    assert not task.state.terminal, task.state
    if point == CTRL_C:
        assert task.lease is None  # a graceful stop gives the lease back
    else:
        assert task.lease is not None  # a SIGKILL leaves it behind
    return task


def assert_pinned_to_bob(task: StoredPlanTask) -> None:
    pin = task.pins["w"]
    assert (pin.where, pin.revision, pin.version) == (BOB, 0, "1.0.0")
    assert pin.idempotency_key == f"{task.task_id}:w:0"
    assert (task.usage.steps, task.usage.peer_calls) == (1, 1)  # checkpointed with the pin


@pytest.mark.parametrize("point", POINTS)
def test_write_killed_then_resumed_with_bob_down_never_runs_on_carol(
    scene: Scene, point: str
) -> None:
    task = crash(scene, point)
    reached_bob = point in (*HELD, "after-answer")
    assert scene.runs() == {"bob": int(reached_bob), "carol": 0}
    if point == "before-checkpoint":
        assert task.pins == {}
    else:
        assert_pinned_to_bob(task)
    scene.bob.kill()

    code, result, err = resume(scene, task.task_id)

    if point == "before-checkpoint":  # nothing was sent anywhere: carol may run it, once
        assert (code, result["state"], result["reason"]) == (0, "completed", "OK"), err
        assert result["steps"]["w"]["where"] == CAROL
        assert scene.runs() == {"bob": 0, "carol": 1}
        return
    assert (code, result["state"], result["reason"]) == (1, "failed", "PEER_UNAVAILABLE"), err
    assert result["message"].startswith(f"step 'w' failed on {BOB}: could not reach {BOB}; ")
    assert WRITE_IN_DOUBT in result["message"]
    w = result["steps"]["w"]
    assert (w["status"], w["where"], w["may_have_written"]) == ("failed", BOB, True)
    assert scene.runs() == {"bob": int(reached_bob), "carol": 0}
    after = stored(scene)
    assert (after.state.value, after.reason, after.lease) == ("failed", "PEER_UNAVAILABLE", None)


@pytest.mark.parametrize(
    ("point", "state", "reason", "replayed"),
    [
        ("after-checkpoint-before-send", "completed", "OK", False),
        (DURING_RUN, "failed", "IDEMPOTENCY_IN_DOUBT", False),
        ("after-answer", "completed", "OK", True),
    ],
)
def test_write_killed_then_resumed_with_bob_up_goes_to_bob_with_the_same_key(
    scene: Scene, point: str, state: str, reason: str, replayed: bool
) -> None:
    task = crash(scene, point)
    assert_pinned_to_bob(task)
    (scene.states["bob"] / RELEASE_FILE).touch()  # lets a held call end, if it still runs

    code, result, err = resume(scene, task.task_id)

    assert (result["state"], result["reason"]) == (state, reason), (result, err)
    assert code == (0 if state == "completed" else 1)
    w = result["steps"]["w"]
    assert w["where"] == BOB
    if state == "completed":
        assert (w["status"], w["replayed"], w["output"]) == ("completed", replayed, {"entries": 1})
    else:
        assert result["message"].startswith(f"step 'w' failed on {BOB}: ")
    assert scene.runs() == {"bob": 1, "carol": 0}


def test_resume_while_another_process_runs_the_task_is_refused(scene: Scene) -> None:
    """Two processes at once: ``run`` holds the task (bob holds its write); a concurrent
    ``tasks --resume`` is refused TASK_LEASED and sends nothing; the first run completes."""
    (scene.states["bob"] / HOLD_FILE).touch()
    proc = subprocess.Popen(
        cli("run", "--config", str(scene.alice_config), str(scene.plan), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        for _ in range(int(CLI_TIMEOUT / POLL)):  # bounded: until bob holds the call
            if scene.runs()["bob"] or proc.poll() is not None:
                break
            time.sleep(POLL)
        assert scene.runs()["bob"] == 1, proc.communicate(timeout=CLI_TIMEOUT)
        task = stored(scene)
        assert task.lease is not None and task.lease.owner.split(":")[1] == str(proc.pid)

        second = subprocess.run(
            cli("tasks", "--config", str(scene.resume_config), "--resume", task.task_id),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=CLI_TIMEOUT,
        )
        assert second.returncode == 1, second
        assert second.stderr.startswith(
            f"refused: TASK_LEASED: task {task.task_id} is being run by "
        )
        assert scene.runs() == {"bob": 1, "carol": 0}

        (scene.states["bob"] / RELEASE_FILE).touch()
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert (result["state"], result["steps"]["w"]["where"]) == ("completed", BOB)
    assert scene.runs() == {"bob": 1, "carol": 0}
    assert stored(scene).lease is None


FAILING_STEPS = {
    # A read that failed on bob: the planner moves it away from bob, to carol.
    "read": {"id": "w", "capability": "ledger.peek", "input": {"entry": "look"}},
    # A write that ran on bob and failed: it may have written there, so the task fails.
    "write": {"id": "w", "capability": "ledger.write", "input": {"entry": "once"}},
}
ENDINGS = {
    "read": (
        0,
        "completed",
        "OK",
        [f"step 'w': {BOB} answered CAPABILITY_FAILED; rerouting away from it"],
    ),
    "write": (1, "failed", "CAPABILITY_FAILED", []),
}


def invocations(scene: Scene, kind: str) -> dict[str, int]:
    """Real runs of the step's capability on each peer."""
    if kind == "write":
        return scene.runs()
    return {name: peek_runs(state) for name, state in scene.states.items()}


def outcome(result: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on whether the run was interrupted (ids and times left out)."""
    keep = ("status", "where", "attempts", "reason", "message", "notes", "may_have_written")
    return {
        **{key: result[key] for key in ("state", "reason", "message", "revision", "peer_calls")},
        "revisions": [r["reason"] for r in result["revisions"]],
        "steps": {sid: {key: step[key] for key in keep} for sid, step in result["steps"].items()},
    }


def unfinished(scene: Scene) -> StoredPlanTask:
    """alice's only task that has not ended, as checkpointed."""
    return next(task for task in all_tasks(scene) if not task.state.terminal)


def all_tasks(scene: Scene) -> list[StoredPlanTask]:
    async def load() -> list[StoredPlanTask]:
        store = scene.open_store()
        try:
            return [await store.load(task.task_id) for task in await store.list()]
        finally:
            store.close()

    return asyncio.run(load())


def calls_at_bob(scene: Scene, task_id: str) -> list[str]:
    """Request ids of the calls for step ``w`` of ``task_id`` that reached bob (audited;
    a write's call has its admission and its outcome audited under the same id)."""
    rows = audit_rows(scene.bob_audit)
    return sorted({r.request_id for r in rows if (r.task_id, r.step_id) == (task_id, "w")})


@pytest.mark.parametrize("kind", ["read", "write"])
def test_failure_recorded_then_killed_resumes_as_the_run_that_was_not_killed(
    scene: Scene, kind: str
) -> None:
    step = FAILING_STEPS[kind]
    document = {"goal": "one step", "max_risk": "write", "steps": [step]}
    scene.plan.write_text(json.dumps({**document, "budget": {"max_elapsed_seconds": 60}}))
    (scene.states["bob"] / FAIL_FILE).touch()
    code, result, err = run_to_the_end(scene)  # the run nothing interrupts, for comparison
    want_code, want_state, want_reason, want_revisions = ENDINGS[kind]
    assert (code, result["state"], result["reason"]) == (want_code, want_state, want_reason), err
    assert [r["reason"] for r in result["revisions"]] == want_revisions
    expected = outcome(result)
    per_run = invocations(scene, kind)
    assert per_run == {"bob": 1, "carol": 1 if kind == "read" else 0}

    run_until_killed(scene, AFTER_FAILURE_RECORDED)
    task = unfinished(scene)
    assert task.lease is not None and task.revisions == ()  # killed before the revision
    w = task.steps["w"]
    assert (w.status.value, w.revision, w.where, w.reason) == (
        "failed",
        0,
        BOB,
        "CAPABILITY_FAILED",
    )
    digest = comparison_digest(step["input"])
    assert FailedAttempt("w", BOB, digest) in task.failed_attempts
    assert invocations(scene, kind) == {"bob": 2, "carol": per_run["carol"]}

    code, resumed, err = resume(scene, task.task_id)

    assert code == want_code, err
    assert outcome(resumed) == expected
    assert invocations(scene, kind) == {name: 2 * n for name, n in per_run.items()}
    after = stored_task(scene, task.task_id)
    assert (after.state.value, after.reason, after.lease) == (want_state, want_reason, None)
    assert scene.bob.terminate() == 0  # a graceful stop: bob's audit log holds every call
    assert len(calls_at_bob(scene, result["task_id"])) == 1
    [before_the_kill] = calls_at_bob(scene, task.task_id)  # none after the restart
    assert before_the_kill.startswith(f"{task.task_id}.w.0.1.")


def stored_task(scene: Scene, task_id: str) -> StoredPlanTask:
    return next(task for task in all_tasks(scene) if task.task_id == task_id)
