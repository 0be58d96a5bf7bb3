"""The official MCP Python SDK client against ``a2a-gateway serve`` (a real process).

The same agent as the TypeScript client's (tests/interop/test_node_mcp_client.py),
called with the Python SDK's own client, which speaks the 2026-07-28 revision:
tools listed per caller, a call, a refusal with our reason, progress, a
cancellation the capability sees, and no connection without a certificate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from tests.a2a_http_support import https_certificate
from tests.agent_process import AgentProcess, write_agent_toml
from tests.integration.mcp.mcp_support import MODERN, sdk_client
from tests.support import Pki, audit_rows, grant, write_policy


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> Iterator[str]:
    """alice as ``serve`` runs her with ``[mcp] listen``; yields her MCP URL."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", ["text.echo", "mcp.steps", "mcp.watch"]), grant("carol", ["text.echo"])],
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
        yield line.removeprefix("mcp on ").strip()
    finally:
        process.ensure_stopped()


async def test_the_python_sdk_client_against_a_served_agent(
    served: str, pki: Pki, tmp_path: Path
) -> None:
    progress: list[str | None] = []

    async def seen(_value: float, _total: float | None, message: str | None) -> None:
        progress.append(message)

    async with sdk_client(served, pki, "carol") as carol:
        carol_tools = [tool.name for tool in (await carol.list_tools()).tools]
    async with sdk_client(served, pki, "bob") as bob:
        assert bob.protocol_version == MODERN
        bob_tools = sorted(tool.name for tool in (await bob.list_tools()).tools)
        echoed = await bob.call_tool("text.echo", {"text": "served"})
        with pytest.raises(MCPError) as refused:
            await bob.call_tool("text.search", {"query": "q"})
        stepped = await bob.call_tool("mcp.steps", {"tag": "p"}, progress_callback=seen)
        watching = asyncio.create_task(bob.call_tool("mcp.watch", {"tag": "gone"}))
        marker = tmp_path / "alice-state" / "cancelled" / "gone"
        await asyncio.sleep(1.0)  # running by now
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
        for _ in range(100):
            if marker.exists():
                break
            await asyncio.sleep(0.1)
    with pytest.raises(Exception):  # noqa: B017 - the SDK's own connect error
        async with sdk_client(served, pki, None) as anonymous:
            await anonymous.list_tools()

    assert carol_tools == ["text.echo"]
    assert bob_tools == ["mcp.steps", "mcp.watch", "text.echo"]
    assert echoed.structured_content == {"text": "served"}
    assert refused.value.error.data == {"reason": "CAPABILITY_NOT_GRANTED", "domain": "a2agw.v1"}
    assert progress == ["step 1", "step 2", "step 3"]
    assert stepped.structured_content == {"done": "p"}
    assert marker.exists()  # the capability saw its cancellation
    rows = [(r.capability, r.reason) for r in audit_rows(tmp_path / "alice-audit.sqlite")]
    for expected in (
        ("text.echo", "OK"),
        ("text.search", "CAPABILITY_NOT_GRANTED"),
        ("", "UNAUTHENTICATED"),
    ):
        assert expected in rows
