"""Clients of other implementations, each its own process, against ``a2a-gateway serve``.

- the a2a-sdk Python client with its default configuration (JSON-RPC,
  streaming on, as the card says ``streaming: true``), and with HTTP+JSON
  preferred (streaming too);
- the official JavaScript SDK (``@a2a-js/sdk``, pinned in
  tests/interop/node-a2a/package-lock.json) over JSON-RPC, HTTP+JSON and gRPC.

Each fetches and checks the signed public card, gets bob's extended card,
sends a data message and a text message (to ``text.echo``, whose input is one
string ``text``), streams one (the task, then status and artifact events, the
last terminal), sends a long-running task with ``return_immediately`` and
polls it with GetTask until it completed, cancels another (the capability saw
its cancellation: ``job.watch`` leaves a file), and is refused a text part to
a capability that takes no text (INVALID_INPUT), an ungranted capability
(CAPABILITY_NOT_GRANTED), carol's task (TASK_NOT_FOUND) and, without a
certificate, everything but the public card (UNAUTHENTICATED). Each refusal
is exactly one audit record; the cancel is audited with the canceller.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.server.a2a.task_store.sqlite import SqliteA2ATaskStore
from tests.helpers.a2a_grpc import a2a_task
from tests.helpers.a2a_http import carol_task, https_certificate
from tests.helpers.agent_process import REPO, AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, grant, spiffe, write_policy
from tests.helpers.node_projects import A2A_JS, node_ready

pytestmark = pytest.mark.slow

NODE_DIR = A2A_JS
BOB = spiffe("bob")


class Served:
    def __init__(
        self, process: AgentProcess, audit_db: Path, state_dir: Path, carol_task: str
    ) -> None:
        self.process = process
        self.audit_db = audit_db
        self.cancelled_dir = state_dir / "cancelled"  # where job.watch says it was cancelled
        self.carol_task = carol_task

    def cancels(self) -> list[tuple[str, str, str]]:
        """(peer, task id, detail) of every cancelled run's audit record."""
        return [
            (r.peer_id, r.task_id, r.detail)
            for r in audit_rows(self.audit_db)
            if r.reason == "CANCELLED"
        ]

    def refusals(self) -> Counter[tuple[str, str]]:
        """(peer, reason) of every refusal committed so far (refusals are durable)."""
        return Counter(
            (r.peer_id, r.reason) for r in audit_rows(self.audit_db) if r.decision == "refuse"
        )


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> Iterator[Served]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant(
                "bob",
                ["text.echo@^1", "text.search@^1", "job.pause", "job.watch"],
                max_payload_bytes=1024,
            ),
            grant("carol", ["text.echo"]),
        ],
    )
    audit_db = tmp_path / "alice-audit.sqlite"
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=audit_db,
        state_dir=tmp_path / "alice-state",
        modules=("tests.helpers.task_capabilities",),  # the built-ins, job.pause, job.watch
    )
    cert, key = https_certificate(pki, "alice", tmp_path / "https")
    text = config.read_text()
    text = text.replace(str(pki.dir / "alice.pem"), str(cert))
    text = text.replace(str(pki.dir / "alice.key"), str(key))
    config.write_text(text + '\n[a2a]\nhttp_listen = "localhost:0"\n')
    process = AgentProcess(config)
    try:
        process.start()
        assert process.https_url.startswith("https://localhost:")
        yield Served(
            process, audit_db, tmp_path / "alice-state", carol_task(pki, process.https_url)
        )
    finally:
        process.ensure_stopped()


def _stuck_task(state_dir: Path, task_id: str) -> None:
    """A WORKING ``job.watch`` row of bob's, leased by a live-looking process, created so long
    ago that its timeout and lease sweep have passed: a subscription fails after its first event."""
    long_ago = int((time.time() - 7200) * 1000)
    task = a2a_task(task_id, BOB, "job.watch", created_ms=long_ago)
    store = SqliteA2ATaskStore(state_dir / "a2a-tasks.sqlite")
    try:
        asyncio.run(store.save(task, "a-process-that-hangs", int((time.time() + 3600) * 1000)))
    finally:
        store.close()


def _python_client(pki: Pki, served: Served, binding: str) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "helpers" / "a2a_http_client_script.py"),
            served.process.https_url,
            spiffe("alice"),
            str(pki.dir / "ca.pem"),
            str(pki.dir / "bob.pem"),
            str(pki.dir / "bob.key"),
            binding,
            served.carol_task,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


EXPECTED_REFUSALS = Counter(
    {(BOB, "INVALID_INPUT"): 1, (BOB, "CAPABILITY_NOT_GRANTED"): 1, (BOB, "TASK_NOT_FOUND"): 1}
)
"""Per client and binding; plus ("", "UNAUTHENTICATED") for each client without a certificate."""
STREAM = ["task:SUBMITTED", "status:WORKING", "artifact", "status:COMPLETED"]


@pytest.mark.parametrize("binding", ["default", "rest"])
def test_the_python_sdk_client_in_its_own_process(pki: Pki, served: Served, binding: str) -> None:
    before = served.refusals()
    answer = _python_client(pki, served, binding)
    assert answer["skills"] == ["job.pause", "job.watch", "text.echo", "text.search"]
    assert (answer["state"], answer["output"]) == ("COMPLETED", {"text": "hello"})
    assert answer["stream"] == STREAM  # streamed: the card says streaming, the SDK uses it
    assert answer["text"] == ["COMPLETED", {"text": "hi there"}]
    polled = answer["polled"]
    assert polled["answered"] in {"SUBMITTED", "WORKING"}
    assert (polled["seen"][-1], polled["output"]) == ("COMPLETED", {"done": "p"})
    cancelled = answer["cancelled"]
    assert cancelled["state"] == "CANCELED"
    assert (served.cancelled_dir / f"{binding}-watch").is_file()  # the capability saw it
    assert served.cancels() == [(BOB, cancelled["id"], f"A2A CancelTask by {BOB}")]
    for key, reason in [
        ("text_part", "INVALID_INPUT"),
        ("not_granted", "CAPABILITY_NOT_GRANTED"),
        ("other_task", "TASK_NOT_FOUND"),
        ("no_certificate", "UNAUTHENTICATED"),
    ]:
        assert answer[key]["reason"] == reason, (key, answer[key])
        if binding == "default":  # JSON-RPC: the message alone names it too
            assert f"{reason}: " in answer[key]["message"], (key, answer[key])
    # Where the spec defines the error the SDK raises its own class for it.
    assert answer["other_task"]["type"] == "TaskNotFoundError"
    assert answer["text_part"]["type"] == "InvalidParamsError"
    expected = EXPECTED_REFUSALS + Counter({("", "UNAUTHENTICATED"): 1})
    assert served.refusals() - before == expected


def test_the_javascript_sdk_client_on_three_bindings(
    pki: Pki, served: Served, tmp_path: Path
) -> None:
    node_ready(NODE_DIR, "@a2a-js/sdk")
    stuck = {binding: f"stuck-{n}" for n, binding in enumerate(("JSONRPC", "HTTP+JSON", "GRPC"))}
    for task_id in stuck.values():
        _stuck_task(served.cancelled_dir.parent, task_id)
    config = tmp_path / "node-client.json"
    config.write_text(
        json.dumps(
            {
                "https_url": served.process.https_url,
                "server_id": spiffe("alice"),
                "ca": str(pki.dir / "ca.pem"),
                "cert": str(pki.dir / "bob.pem"),
                "key": str(pki.dir / "bob.key"),
                "other_task": served.carol_task,
                "stuck_tasks": stuck,
            }
        )
    )
    before = served.refusals()
    result = subprocess.run(
        ["node", str(NODE_DIR / "client.mjs"), str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=NODE_DIR,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("{"), (result.stdout[:2000], result.stderr[-2000:])
    answer = json.loads(result.stdout)
    for binding in ("JSONRPC", "HTTP+JSON", "GRPC"):
        got = answer[binding]
        assert "error" not in got, got
        assert got["transport"] == binding
        assert got["skills"] == ["job.pause", "job.watch", "text.echo", "text.search"]
        assert got["card_signature"] == "verified"  # the JS SDK's own JWS/JCS check
        assert (got["state"], got["output"]) == (3, {"text": "hello"})  # TASK_STATE_COMPLETED
        assert got["text"] == ["COMPLETED", {"text": "hi there"}]
        assert got["stream"] == STREAM, got
        polled = got["polled"]
        assert polled["answered"] in {"SUBMITTED", "WORKING"}
        assert (polled["seen"][-1], polled["output"]) == ("COMPLETED", {"done": "p"})
        cancelled = got["cancelled"]
        assert cancelled["state"] == "CANCELED"
        assert (served.cancelled_dir / cancelled["tag"]).is_file()  # the capability saw it
        assert got["text_part"]["reason"] == "INVALID_INPUT", got
        assert got["not_granted"]["reason"] == "CAPABILITY_NOT_GRANTED", got
        assert got["other_task"]["reason"] == "TASK_NOT_FOUND", got
        # An error after the stream started: the task, then our reason code.
        assert got["subscribed"]["kinds"] == ["task:WORKING"], got
        assert got["subscribed"]["error"]["reason"] == "DEADLINE_EXCEEDED", got
    assert answer["no_certificate"]["reason"] == "UNAUTHENTICATED", answer
    cancelled_ids = {
        answer[binding]["cancelled"]["id"] for binding in ("JSONRPC", "HTTP+JSON", "GRPC")
    }
    assert sorted(served.cancels()) == sorted(
        (BOB, task_id, f"A2A CancelTask by {BOB}") for task_id in cancelled_ids
    )
    expected = Counter({key: 3 * n for key, n in EXPECTED_REFUSALS.items()})
    expected[("", "UNAUTHENTICATED")] = 1
    expected[(BOB, "DEADLINE_EXCEEDED")] = 3  # the subscriptions that outlived their task's bound
    assert served.refusals() - before == expected
