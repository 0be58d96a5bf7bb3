"""A client that is not ours: the official MCP TypeScript SDK against ``a2a-gateway serve``.

``@modelcontextprotocol/sdk`` (pinned in ``node-mcp/package-lock.json``)
speaks the handshake era (2025-11-25) over Streamable HTTP with mTLS (undici):
it lists tools (each caller its own), calls one, is refused with our reason,
follows progress, cancels a call, and cannot connect without a certificate.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.a2a_http_support import https_certificate
from tests.agent_process import AgentProcess, write_agent_toml
from tests.interop.node_projects import node_ready
from tests.support import Pki, audit_rows, grant, write_policy

NODE_MCP = Path(__file__).parent / "node-mcp"


class ServedMcp:
    """alice as ``serve`` runs her, with ``[mcp] listen``."""

    def __init__(self, process: AgentProcess, url: str, base: Path) -> None:
        self.process = process
        self.url = url
        self.base = base

    def records(self) -> list[tuple[str, str, str, str, str]]:
        """(peer, capability, decision, reason, detail) of every committed audit record."""
        return [
            (r.peer_id.rsplit("/", 1)[-1], r.capability, r.decision, r.reason, r.detail)
            for r in audit_rows(self.base / "alice-audit.sqlite")
        ]


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> Iterator[ServedMcp]:
    node_ready(NODE_MCP, "@modelcontextprotocol/sdk")
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            grant("bob", ["text.echo", "text.search", "mcp.steps", "mcp.watch"]),
            grant("carol", ["text.echo"]),
        ],
    )
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "alice-audit.sqlite",
        state_dir=tmp_path / "alice-state",
        modules=["tests.interop.mcp_served_capabilities"],
    )
    cert, key = https_certificate(pki, "alice", tmp_path / "https")
    text = config.read_text()
    text = text.replace(str(pki.dir / "alice.pem"), str(cert))
    text = text.replace(str(pki.dir / "alice.key"), str(key))
    config.write_text(text + '\n[mcp]\nlisten = "localhost:0"\n')
    process = AgentProcess(config)
    try:
        process.start()
        assert process.stdout is not None
        [line] = [line for line in process.stdout.seen if line.startswith("mcp on ")]
        yield ServedMcp(process, line.removeprefix("mcp on ").strip(), tmp_path)
    finally:
        process.ensure_stopped()


def run_client(
    served: ServedMcp, pki: Pki, caller: str | None, scenario: str, **fields: Any
) -> dict[str, Any]:
    """Run ``client.mjs`` once; its one JSON line."""
    config: dict[str, Any] = {
        "url": served.url,
        "ca": str(pki.dir / "ca.pem"),
        "scenario": scenario,
    }
    if caller is not None:
        config |= {"cert": str(pki.dir / f"{caller}.pem"), "key": str(pki.dir / f"{caller}.key")}
    path = served.base / f"client-{scenario}.json"
    path.write_text(json.dumps(config | fields))
    done = subprocess.run(
        ["node", "client.mjs", str(path)],
        cwd=NODE_MCP,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def records_once(served: ServedMcp, wanted: int) -> list[tuple[str, str, str, str, str]]:
    """The audit records, read again (for up to 10 s) until ``wanted`` are committed."""
    deadline = time.monotonic() + 10.0
    while len(rows := served.records()) < wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


def test_the_typescript_sdk_lists_and_calls_tools(served: ServedMcp, pki: Pki) -> None:
    bob = run_client(served, pki, "bob", "list")
    carol = run_client(served, pki, "carol", "list")
    called = run_client(served, pki, "bob", "call", tool="text.echo", arguments={"text": "hi"})

    assert bob["server"]["name"] == "a2a-peer-gateway"
    assert sorted(tool["name"] for tool in bob["tools"]) == [
        "mcp.steps",
        "mcp.watch",
        "text.echo",
        "text.search",
    ]
    assert [tool["name"] for tool in carol["tools"]] == ["text.echo"]
    echo = next(tool for tool in bob["tools"] if tool["name"] == "text.echo")
    assert echo["annotations"]["readOnlyHint"] is True
    assert echo["inputSchema"]["required"] == ["text"]
    assert called["result"]["structuredContent"] == {"text": "hi"}
    assert called["result"]["isError"] is False
    assert records_once(served, 1) == [("bob", "text.echo", "allow", "OK", "")]


def test_the_typescript_sdk_sees_our_reasons(served: ServedMcp, pki: Pki) -> None:
    not_granted = run_client(served, pki, "carol", "call", tool="text.search", arguments={})
    invalid = run_client(served, pki, "bob", "call", tool="text.echo", arguments={"txt": "x"})
    anonymous = run_client(served, pki, None, "list")

    assert not_granted["error"]["code"] == -32602
    assert not_granted["error"]["data"] == {
        "reason": "CAPABILITY_NOT_GRANTED",
        "domain": "a2agw.v1",
    }
    assert invalid["result"]["isError"] is True
    assert invalid["result"]["_meta"]["a2agw/reason"] == "INVALID_INPUT"
    assert anonymous["connected"] is False
    assert anonymous["error"]["code"] == 401
    assert "UNAUTHENTICATED" in anonymous["error"]["message"]
    assert [row[:4] for row in records_once(served, 3)] == [
        ("carol", "text.search", "refuse", "CAPABILITY_NOT_GRANTED"),
        ("bob", "text.echo", "refuse", "INVALID_INPUT"),
        ("", "", "refuse", "UNAUTHENTICATED"),
    ]


def test_the_typescript_sdk_follows_progress_and_cancels(served: ServedMcp, pki: Pki) -> None:
    progress = run_client(served, pki, "bob", "progress", tool="mcp.steps", arguments={"tag": "p"})
    cancel = run_client(served, pki, "bob", "cancel", tool="mcp.watch", arguments={"tag": "c"})

    assert [p["message"] for p in progress["progress"]] == ["step 1", "step 2", "step 3"]
    assert progress["result"]["structuredContent"] == {"done": "p"}
    assert cancel["cancelled"] is True
    assert cancel["after"]["structuredContent"] == {"text": "after"}
    marker = served.base / "alice-state" / "cancelled" / "c"
    deadline = time.monotonic() + 10.0
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists()  # the capability saw its cancellation
    rows = records_once(served, 3)
    assert ("bob", "mcp.watch", "allow", "CANCELLED") in [row[:4] for row in rows]
