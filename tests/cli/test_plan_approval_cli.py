"""The approval flow through the CLI, as separate processes: ``run`` stops with exit code 3
and shows what would be sent; ``tasks --approve`` (audited) resumes it to completion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.plan_commands import EXIT_WAITING_APPROVAL
from tests.helpers.agent_process import REPO, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, write_policy

pytestmark = pytest.mark.slow

CLI_TIMEOUT = 60.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway.cli.main", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, timeout=CLI_TIMEOUT, check=False
    )


def test_run_waits_then_approve_completes_once(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [])
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
    )
    document = {
        "goal": "store a secret",
        "max_risk": "write",
        "approval": {"min_risk": "write"},
        "steps": [
            {"id": "put", "capability": "kv.put", "input": {"key": "k", "value": "hush-123"}},
            {"id": "get", "capability": "kv.get", "depends_on": ["put"], "input": {"key": "k"}},
        ],
    }
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(document))

    first = cli("run", "--config", str(config), str(plan))
    assert first.returncode == EXIT_WAITING_APPROVAL == 3, first.stderr
    assert "would call kv.put 1.0.0 (risk write) on local" in first.stdout
    assert "field value: 10 bytes" in first.stdout and "hush-123" not in first.stdout
    task_id = first.stderr.split("--approve ", 1)[1].split()[0]

    shown = cli("tasks", "--config", str(config), "--resume", task_id, "--show-values")
    assert shown.returncode == 3, shown.stderr
    assert 'field value: 10 bytes = "hush-123"' in shown.stdout

    approved = cli("tasks", "--config", str(config), "--approve", task_id, "put", "--json")
    assert approved.returncode == 0, approved.stderr
    result = json.loads(approved.stdout)
    assert (result["state"], result["approvals"]) == ("completed", [])
    assert result["steps"]["put"]["output"] == {"key": "k", "revision": 1}  # written once
    assert result["steps"]["get"]["output"]["value"] == "hush-123"
    assert result["tool_calls"] == 2
    rows = [r for r in audit_rows(tmp_path / "alice-audit.sqlite") if r.reason == "APPROVED"]
    assert [(r.task_id, r.step_id, r.capability) for r in rows] == [(task_id, "put", "kv.put")]
    assert "hush" not in json.dumps(rows[0].to_json_dict())

    again = cli("tasks", "--config", str(config), "--deny", task_id, "put")
    assert again.returncode == 2 and "has no step 'put' waiting for approval" in again.stderr
