"""MCP servers built with the official SDK, fronted as capabilities (``[[mcp_upstreams]]``).

bob runs the SDK server of ``sdk_tool_server`` as a stdio program (or reaches
it over Streamable HTTP) and serves its tools as ``tools.*``: alice calls them
with Invoke, with an A2A client, with a plan step, and through bob's own MCP
endpoint, under bob's policy and audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, McpSettings
from gateway.errors import GatewayError
from gateway.plans import Plan
from gateway.plans.task import PlanTaskState
from gateway.runtime.agent import Agent
from tests.helpers import mcp_sdk_tool_server as sdk_tool_server
from tests.helpers.a2a_grpc import A2APeer, data_request, output_of
from tests.helpers.a2a_http import https_certificate
from tests.helpers.agents import (
    Pki,
    agent_config,
    audit_rows,
    grant,
    outbound_rule,
    spiffe,
    start_peer,
    write_policy,
)
from tests.helpers.mcp import sdk_client, served_app

REPO = Path(__file__).resolve().parents[2]


def tool_entries(timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every tool of the SDK server, as ``tools.NAME``."""
    risks = {"echo": "read", "add": "read", "steps": "read", "wait": "read", "fail": "write"}
    return [
        {
            "tool": name,
            "capability": f"tools.{name}",
            "version": "1.0.0",
            "risk": risk,
            "timeout": 2.0 if name == "wait" else timeout,
        }
        for name, risk in risks.items()
    ]


def stdio_entry(markers: Path, *args: str) -> dict[str, Any]:
    """The SDK server as a stdio program (``MARKER_DIR``: where ``wait`` leaves its proof)."""
    return {
        "name": "tools",
        "command": sys.executable,
        "args": ["-m", "tests.helpers.mcp_sdk_tool_server", *args],
        "cwd": str(REPO),
        "env": {"MARKER_DIR": str(markers)},
        "tools": tool_entries(),
    }


@contextlib.asynccontextmanager
async def fronting(
    pki: Pki, base: Path, entry: dict[str, Any], *, serve_mcp: bool = False
) -> AsyncIterator[Agent]:
    """bob: no capabilities of his own, only the MCP server's tools."""
    policy = write_policy(
        base / "bob-policy.toml",
        [
            grant(
                "alice",
                ["tools.echo", "tools.add", "tools.steps", "tools.wait", "tools.fail"],
                max_payload_bytes=4096,
            ),
            grant("carol", ["tools.echo"]),
        ],
    )
    plain = agent_config(pki, base, "bob", policy)
    if serve_mcp:
        cert, key = https_certificate(pki, "bob", base / "https")
        plain = plain.model_copy(
            update={
                "tls": plain.tls.model_copy(update={"cert": cert, "key": key}),
                "mcp": McpSettings(listen="localhost:0"),
            }
        )
    config = AgentConfig.model_validate({**plain.model_dump(), "mcp_upstreams": [entry]})
    bob = Agent(config, CapabilityRegistry())
    await bob.start(watch_policy=False)
    try:
        yield bob
    finally:
        await bob.stop(grace=0)


async def _outcomes(bob: Agent) -> list[tuple[str, str, str, str]]:
    await bob.audit.flush()
    return [
        (r.peer_id.rsplit("/", 1)[-1], r.capability, r.decision, r.reason)
        for r in audit_rows(bob.config.audit_db)
    ]


def _peer(pki: Pki, bob: Agent, caller: str = "alice") -> PeerClient:
    return PeerClient(spiffe("bob"), bob.address, pki.material(caller))


async def _refusal(pki: Pki, bob: Agent, caller: str, capability: str, payload: Any) -> str:
    async with _peer(pki, bob, caller) as peer:
        with pytest.raises(GatewayError) as refused:
            await peer.invoke(capability, payload)
    return refused.value.reason


async def test_a_stdio_servers_tools_are_capabilities(pki: Pki, tmp_path: Path) -> None:
    async with fronting(pki, tmp_path, stdio_entry(tmp_path)) as bob:
        echo = bob.registry.resolve("tools.echo", VersionConstraint.parse(""))
        add = bob.registry.resolve("tools.add", VersionConstraint.parse(""))
        async with _peer(pki, bob) as peer:
            echoed = await peer.invoke("tools.echo", {"text": "hi"})
            added = await peer.invoke("tools.add", {"a": 2})
            added_all = await peer.invoke("tools.add", {"a": 2, "b": 3, "note": "n"})
        refused = [
            await _refusal(pki, bob, "carol", "tools.add", {"a": 1}),
            await _refusal(pki, bob, "alice", "tools.add", {"a": 1, "secret": "x"}),
            await _refusal(pki, bob, "alice", "tools.add", {"a": "1"}),
        ]
        outcomes = await _outcomes(bob)

    assert echo is not None and add is not None
    assert echo.contract.description == "Echo a text."
    assert echo.upstream == add.upstream == "mcp:tools"
    assert add.contract.output_schema()["required"] == ["sum", "keys"]
    assert echoed.output() == {"text": "echo: hi"}
    # Only the declared fields the caller set leave bob (b's schema default is not sent).
    assert added.output() == {"sum": 2, "keys": ["a"]}
    assert added_all.output() == {"sum": 5, "keys": ["a", "b", "note"]}
    assert refused == ["CAPABILITY_NOT_GRANTED", "INVALID_INPUT", "INVALID_INPUT"]
    assert outcomes == [
        ("alice", "tools.echo", "allow", "OK"),
        ("alice", "tools.add", "allow", "OK"),
        ("alice", "tools.add", "allow", "OK"),
        ("carol", "tools.add", "refuse", "CAPABILITY_NOT_GRANTED"),
        ("alice", "tools.add", "refuse", "INVALID_INPUT"),
        ("alice", "tools.add", "refuse", "INVALID_INPUT"),
    ]


async def test_an_a2a_client_and_a_plan_step_call_the_fronted_tools(
    pki: Pki, tmp_path: Path
) -> None:
    async with fronting(pki, tmp_path, stdio_entry(tmp_path)) as bob:
        async with A2APeer(pki, bob, "alice") as alice_a2a:
            task = await alice_a2a.send(data_request("tools.add", {"a": 1, "b": 2}))
        alice = await start_peer(
            pki,
            tmp_path,
            "alice",
            CapabilityRegistry(),
            [],
            outbound=[outbound_rule("bob", ["tools.echo", "tools.add"])],
            peers=[bob],
        )
        try:
            plan = Plan.model_validate(
                {
                    "goal": "add, then echo the sum's keys",
                    "steps": [
                        {"id": "sum", "capability": "tools.add", "input": {"a": 40, "b": 2}},
                        {
                            "id": "say",
                            "capability": "tools.echo",
                            "depends_on": ["sum"],
                            "input": {"text": "answer"},
                        },
                    ],
                }
            )
            result = await alice.run(plan)
        finally:
            await alice.stop(grace=0)
        outcomes = await _outcomes(bob)

    assert output_of(task) == {"sum": 3, "keys": ["a", "b"]}
    assert (result.state, result.reason) == (PlanTaskState.COMPLETED, "OK")
    assert result.output("sum") == {"sum": 42, "keys": ["a", "b"]}
    assert result.output("say") == {"text": "echo: answer"}
    assert [o[1:] for o in outcomes] == [("tools.add", "allow", "OK")] * 2 + [
        ("tools.echo", "allow", "OK")
    ]


async def test_progress_and_cancellation_pass_through_both_hops(pki: Pki, tmp_path: Path) -> None:
    seen: list[str | None] = []

    async def progress(_value: float, _total: float | None, message: str | None) -> None:
        seen.append(message)

    async with fronting(pki, tmp_path, stdio_entry(tmp_path), serve_mcp=True) as bob:
        async with sdk_client(bob.mcp_url, pki, "alice") as client:
            done = await client.call_tool("tools.steps", {"n": 3}, progress_callback=progress)
            call = asyncio.create_task(client.call_tool("tools.wait", {"tag": "left"}))
            await asyncio.sleep(0.5)  # the server is waiting by now
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            for _ in range(100):
                if (tmp_path / "left").exists():
                    break
                await asyncio.sleep(0.05)
        outcomes = await _outcomes(bob)

    assert seen == ["step 1", "step 2", "step 3"]
    assert done.structured_content == {"text": "done"}
    assert (tmp_path / "left").exists()  # the MCP server saw its call cancelled
    assert ("alice", "tools.wait", "allow", "CANCELLED") in outcomes


async def test_timeouts_and_tool_errors_are_precise_and_quote_nothing(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    entry = stdio_entry(tmp_path, "--stderr-noise")
    async with fronting(pki, tmp_path, entry) as bob:
        timed_out = await _refusal(pki, bob, "alice", "tools.wait", {"tag": "slow"})
        async with _peer(pki, bob) as peer:
            with pytest.raises(GatewayError) as failed:
                await peer.invoke("tools.fail", {})
            after = await peer.invoke("tools.echo", {"text": "still here"})
        outcomes = await _outcomes(bob)

    assert timed_out == "CAPABILITY_TIMEOUT"
    assert (tmp_path / "slow").exists()  # the server was told to stop
    assert failed.value.reason == "CAPABILITY_FAILED"
    assert sdk_tool_server.SECRET_ERROR not in str(failed.value)
    assert after.output() == {"text": "echo: still here"}
    assert outcomes == [
        ("alice", "tools.wait", "allow", "CAPABILITY_TIMEOUT"),
        ("alice", "tools.fail", "allow", "ADMITTED"),
        ("alice", "tools.fail", "allow", "CAPABILITY_FAILED"),
        ("alice", "tools.echo", "allow", "OK"),
    ]
    logged = caplog.text
    assert "secret-in-error" not in logged and "secret-in-stderr" not in logged
    assert "bytes to its standard error (dropped)" in logged


async def test_a_streamable_http_server_with_its_own_identity(pki: Pki, tmp_path: Path) -> None:
    pki.ensure("tools")
    tls = (pki.dir / "tools.pem", pki.dir / "tools.key", pki.dir / "ca.pem")
    async with served_app(sdk_tool_server.http_app(), tls) as port:
        entry = {
            "name": "tools",
            "url": f"https://127.0.0.1:{port}/mcp",
            "id": spiffe("tools"),
            "tools": tool_entries(),
        }
        async with fronting(pki, tmp_path / "right", entry) as bob:
            async with _peer(pki, bob) as peer:
                echoed = await peer.invoke("tools.echo", {"text": "over https"})
        wrong = {**entry, "id": spiffe("carol")}  # the server holds no certificate for carol
        with pytest.raises(GatewayError) as refused:
            async with fronting(pki, tmp_path / "wrong", {**wrong, "start_timeout": 2.0}):
                pass
    assert echoed.output() == {"text": "echo: over https"}
    assert refused.value.reason == "PEER_UNAVAILABLE"


async def test_a_plaintext_loopback_server(pki: Pki, tmp_path: Path) -> None:
    async with served_app(sdk_tool_server.http_app()) as port:
        entry = {"name": "tools", "url": f"http://127.0.0.1:{port}/mcp", "tools": tool_entries()}
        async with fronting(pki, tmp_path, entry) as bob:
            async with _peer(pki, bob) as peer:
                added = await peer.invoke("tools.add", {"a": 1, "b": 1})
    assert added.output() == {"sum": 2, "keys": ["a", "b"]}


async def test_a_fronted_write_runs_once_per_idempotency_key(pki: Pki, tmp_path: Path) -> None:
    entry = stdio_entry(tmp_path)
    entry["tools"] = [
        {**tool, "risk": "write", "idempotent": True} if tool["tool"] == "add" else tool
        for tool in entry["tools"]
    ]
    async with fronting(pki, tmp_path, entry) as bob:
        async with _peer(pki, bob) as peer:
            first = await peer.invoke("tools.add", {"a": 1}, idempotency_key="key-1")
            again = await peer.invoke("tools.add", {"a": 1}, idempotency_key="key-1")
        await bob.audit.flush()
        records = [(r.reason, r.detail) for r in audit_rows(bob.config.audit_db)]
    assert first.output() == again.output() == {"sum": 1, "keys": ["a"]}
    assert (first.remembered, again.remembered) == (False, True)
    # The retry is the idempotency store's answer: the server was called once.
    assert records == [("ADMITTED", ""), ("OK", ""), ("ADMITTED", ""), ("OK", "idempotent replay")]
