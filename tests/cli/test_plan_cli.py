"""`a2a-gateway run` and `tasks`: a plan run from the command line against a served peer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.agent_process import AgentProcess
from tests.helpers.agents import Pki, grant, spiffe
from tests.helpers.cli import agent_files, run

pytestmark = pytest.mark.slow

PLAN = {
    "goal": "find a note about audit logs and echo its title through bob",
    "max_parallel": 2,
    "steps": [
        {
            "id": "search",
            "capability": "text.search",
            "version": "^1",
            "input": {"query": "audit", "limit": 1},
        },
        {
            "id": "echo",
            "capability": "text.echo",
            "depends_on": ["search"],
            "input": {"text": {"$from": "search.items.0.title"}},
        },
    ],
}


def test_run_plan_across_a_served_peer_then_list_tasks(pki: Pki, tmp_path: Path) -> None:
    bob = AgentProcess(agent_files(pki, tmp_path, "bob", grants=[grant("alice", ["text.echo"])]))
    try:
        # alice runs text.search locally but has no text.echo: a peer must run it.
        alice = agent_files(
            pki,
            tmp_path,
            "alice",
            outbound=[{"peer": spiffe("bob"), "capabilities": ["text.echo"]}],
            peers=[("bob", bob.start())],
            modules=["capabilities.builtin.search"],
        )
        (tmp_path / "plan.json").write_text(json.dumps(PLAN))
        result = run("run", "--config", str(alice), str(tmp_path / "plan.json"), "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["state"] == "completed"
        assert report["steps"]["search"]["where"] == "local"
        assert report["steps"]["echo"]["where"] == spiffe("bob")
        assert report["steps"]["echo"]["output"] == {"text": "Audit logs"}

        listed = run("tasks", "--config", str(alice), "--json")
        assert listed.returncode == 0, listed.stderr
        assert [(t["task_id"], t["state"]) for t in json.loads(listed.stdout)] == [
            (report["task_id"], "completed")
        ]
        assert bob.terminate() == 0
    finally:
        bob.ensure_stopped()
    bob_audit = run("audit", "--db", str(tmp_path / "bob-audit.sqlite"), "--json").stdout
    assert [json.loads(line)["peer_id"] for line in bob_audit.splitlines()] == [spiffe("alice")]


def test_invalid_plan_exits_non_zero_naming_the_step(pki: Pki, tmp_path: Path) -> None:
    alice = agent_files(pki, tmp_path, "alice")
    cyclic = {
        "goal": "g",
        "steps": [
            {"id": "a", "capability": "text.echo", "input": {"text": "x"}, "depends_on": ["b"]},
            {"id": "b", "capability": "text.echo", "input": {"text": "x"}, "depends_on": ["a"]},
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(cyclic))
    result = run("run", "--config", str(alice), str(tmp_path / "plan.json"))
    assert result.returncode != 0
    assert result.stderr.strip().endswith("PLAN_INVALID: dependency cycle among steps 'a', 'b'")
    assert "Traceback" not in result.stderr
