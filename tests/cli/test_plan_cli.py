"""`a2a-gateway run` and `tasks`: a plan run from the command line against a served peer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import _free_port, _write_config, run
from tests.support import Pki, grant, spiffe, write_policy

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
    bob_port = _free_port()
    write_policy(tmp_path / "bob-policy.toml", [grant("alice", ["text.echo"])])
    write_policy(
        tmp_path / "alice-policy.toml",
        [],
        outbound=[{"peer": spiffe("bob"), "capabilities": ["text.echo"]}],
    )
    bob = _write_config(pki, tmp_path, "bob", bob_port, [])
    alice = _write_config(pki, tmp_path, "alice", 0, [("bob", bob_port)])
    # alice runs text.search locally but has no text.echo: drop it from her registry.
    text = alice.read_text().replace("[tls]", 'modules = ["capabilities.builtin.search"]\n\n[tls]')
    alice.write_text(text)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    server = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(bob)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert server.stdout is not None and "serving on" in server.stdout.readline()
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
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
    bob_audit = run("audit", "--db", str(tmp_path / "bob-audit.sqlite"), "--json").stdout
    assert [json.loads(line)["peer_id"] for line in bob_audit.splitlines()] == [spiffe("alice")]


def test_invalid_plan_exits_non_zero_naming_the_step(pki: Pki, tmp_path: Path) -> None:
    write_policy(tmp_path / "alice-policy.toml", [])
    alice = _write_config(pki, tmp_path, "alice", 0, [])
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
