"""MCP with ``workers = 2``: both workers serve the one ``[mcp] listen`` port, statelessly.

Each request is a connection of its own here, so the kernel spreads them over
the workers; any worker answers any request (no session), and the replay
window, the audit chain and the limits stay the workers' shared ones.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.http.listener import bind_socket
from tests.a2a_http_support import https_certificate
from tests.agent_process import two_worker_agent
from tests.integration.mcp.mcp_support import modern_call, raw_client
from tests.support import Pki, audit_rows, grant

MAX_CONNECTIONS = 64
"""Connections opened to reach both workers (the kernel spreads them; a bound, never asserted)."""


def _free_port() -> int:
    sock = bind_socket("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    sock.close()
    return port


async def test_two_workers_serve_mcp_on_one_port(pki: Pki, tmp_path: Path) -> None:
    agent = two_worker_agent(pki, tmp_path, [grant("bob", ["worker.pid", "text.echo"])])
    port = _free_port()
    cert, key = https_certificate(pki, "alice", tmp_path / "https")
    text = agent.config.read_text()
    text = text.replace(str(pki.dir / "alice.pem"), str(cert))
    text = text.replace(str(pki.dir / "alice.key"), str(key))
    agent.config.write_text(text + f'\n[mcp]\nlisten = "localhost:{port}"\n')
    url = f"https://localhost:{port}/mcp"
    try:
        await asyncio.to_thread(agent.start)
        pids: set[int] = set()
        for _ in range(MAX_CONNECTIONS):
            body, headers = modern_call("worker.pid", {})
            async with raw_client(pki, "bob") as http:  # a connection of its own
                answer = (await http.post(url, json=body, headers=headers)).json()
            pids.add(answer["result"]["structuredContent"]["pid"])
            if len(pids) == 2:
                break
        replies = []
        for _ in range(4):  # one request id, sent over four connections
            body, headers = modern_call(
                "text.echo", {"text": "once"}, meta={"a2agw/request_id": "only-once"}
            )
            async with raw_client(pki, "bob") as http:
                result = (await http.post(url, json=body, headers=headers)).json()["result"]
            replies.append(result.get("_meta", {}).get("a2agw/reason", "OK"))
    finally:
        await asyncio.to_thread(agent.terminate)

    assert len(pids) == 2  # both workers answered on the one port
    assert replies == ["OK"] + ["REPLAYED_REQUEST"] * 3
    echoes = [r for r in audit_rows(tmp_path / "audit.sqlite") if r.capability == "text.echo"]
    # Chain order is commit order: a sibling's refusal (committed before its answer) may
    # precede the allowed call's record (committed in its worker's next batch).
    assert (
        sorted((r.request_id, r.reason) for r in echoes)
        == [("only-once", "OK")] + [("only-once", "REPLAYED_REQUEST")] * 3
    )
