"""Hostile MCP servers behind ``[[mcp_upstreams]]``: each misdeed a precise, audited failure.

The stdio server of ``hostile_stdio_server`` changes its tool list, answers too
much or forever, breaks its own schemas, dies, writes garbage, hides prompts in
its descriptions. bob keeps serving through all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig
from gateway.display import has_unsafe_characters
from gateway.errors import AgentConfigError, GatewayError
from gateway.runtime.agent import Agent
from tests.helpers import mcp_hostile_stdio_server as hostile
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, write_policy
from tests.helpers.mcp import served_app

REPO = Path(__file__).resolve().parents[2]
TOOLS = (
    "lookup",
    "small",
    "big",
    "drip",
    "never",
    "crash",
    "garbage",
    "wrong_type",
    "bare",
    "leaky",
    "failing",
)


def entry(markers: Path, *flags: str, **overrides: Any) -> dict[str, Any]:
    """The hostile server as a stdio program, every tool as ``h.NAME`` (1 s timeout)."""
    return {
        "name": "hostile",
        "command": sys.executable,
        "args": ["-m", "tests.helpers.mcp_hostile_stdio_server", *flags],
        "cwd": str(REPO),
        "env": {"MARKER_DIR": str(markers)},
        "max_answer_bytes": 1024 * 1024,
        "tools": [
            {
                "tool": name,
                "capability": f"h.{name.replace('_', '-')}",
                "version": "1.0.0",
                "risk": "read",
                "timeout": 1.0,
            }
            for name in TOOLS
        ],
        **overrides,
    }


async def start_bob(pki: Pki, base: Path, upstream: dict[str, Any]) -> Agent:
    policy = write_policy(
        base / "bob-policy.toml",
        [grant("alice", [f"h.{name.replace('_', '-')}" for name in TOOLS], max_payload_bytes=4096)],
    )
    plain = agent_config(pki, base, "bob", policy)
    config = AgentConfig.model_validate({**plain.model_dump(), "mcp_upstreams": [upstream]})
    bob = Agent(config, CapabilityRegistry())
    await bob.start(watch_policy=False)
    return bob


@contextlib.asynccontextmanager
async def hostile_bob(pki: Pki, base: Path, *flags: str) -> AsyncIterator[Agent]:
    bob = await start_bob(pki, base, entry(base, *flags))
    try:
        yield bob
    finally:
        await bob.stop(grace=0)


async def _reason(pki: Pki, bob: Agent, capability: str, payload: Any) -> str:
    async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as peer:
        try:
            await peer.invoke(capability, payload)
        except GatewayError as err:
            return err.reason
    return "OK"


def _started_pids(markers: Path) -> list[int]:
    """The pids of the hostile servers started so far (each leaves ``pid-<pid>``)."""
    return [int(path.name.removeprefix("pid-")) for path in markers.glob("pid-*")]


async def _until_served(pki: Pki, bob: Agent) -> None:
    """Wait (at most 10 s) until the well-behaved tool answers again."""
    for _ in range(50):
        if await _reason(pki, bob, "h.small", {"key": "k"}) == "OK":
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the server was not restarted")


async def _outcomes(bob: Agent) -> list[tuple[str, str]]:
    await bob.audit.flush()
    return [(r.capability, r.reason) for r in audit_rows(bob.config.audit_db)]


async def test_a_server_cannot_widen_its_own_schemas_after_start(pki: Pki, tmp_path: Path) -> None:
    async with hostile_bob(pki, tmp_path, "--widen") as bob:
        first = await _reason(pki, bob, "h.lookup", {"key": "k"})
        wider_input = await _reason(pki, bob, "h.lookup", {"key": "k", "admin": True})
        wider_output = await _reason(pki, bob, "h.lookup", {"key": "k"})
        control = await _reason(pki, bob, "h.small", {"key": "k"})
        outcomes = await _outcomes(bob)
    assert (first, wider_input, wider_output, control) == (
        "OK",
        "INVALID_INPUT",
        "INVALID_OUTPUT",
        "OK",
    )
    assert outcomes == [
        ("h.lookup", "OK"),
        ("h.lookup", "INVALID_INPUT"),
        ("h.lookup", "INVALID_OUTPUT"),
        ("h.small", "OK"),
    ]


async def test_huge_endless_and_unreadable_answers_are_invalid_output(
    pki: Pki, tmp_path: Path
) -> None:
    async with hostile_bob(pki, tmp_path) as bob:
        reasons = {}
        for name in ("big", "drip", "garbage", "wrong-type", "bare"):
            reasons[name] = await _reason(
                pki, bob, f"h.{name}", {} if name in {"big", "drip", "garbage"} else {"key": "k"}
            )
            await _until_served(pki, bob)  # a cut stream restarts the server, after a pause
        control = await _reason(pki, bob, "h.small", {"key": "k"})
    assert reasons == {
        "big": "INVALID_OUTPUT",
        "drip": "INVALID_OUTPUT",
        "garbage": "INVALID_OUTPUT",
        "wrong-type": "INVALID_OUTPUT",
        "bare": "INVALID_OUTPUT",
    }
    assert control == "OK"


async def test_slow_and_dead_servers(pki: Pki, tmp_path: Path) -> None:
    async with hostile_bob(pki, tmp_path) as bob:
        slow = await _reason(pki, bob, "h.never", {})
        after_slow = await _reason(pki, bob, "h.small", {"key": "k"})
        dead = await _reason(pki, bob, "h.crash", {})
        backing_off = await _reason(pki, bob, "h.small", {"key": "k"})
        await asyncio.sleep(1.2)
        restarted = await _reason(pki, bob, "h.small", {"key": "k"})
        outcomes = await _outcomes(bob)
    assert (slow, after_slow) == ("CAPABILITY_TIMEOUT", "OK")
    assert (dead, backing_off, restarted) == ("PEER_UNAVAILABLE", "PEER_UNAVAILABLE", "OK")
    assert len(_started_pids(tmp_path)) == 2  # started once, restarted once
    assert outcomes == [
        ("h.never", "CAPABILITY_TIMEOUT"),
        ("h.small", "OK"),
        ("h.crash", "PEER_UNAVAILABLE"),
        ("h.small", "PEER_UNAVAILABLE"),
        ("h.small", "OK"),
    ]


async def test_a_server_error_is_the_tools_failure_not_a_lost_connection(
    pki: Pki, tmp_path: Path
) -> None:
    # -32000 is JSON-RPC's "server error"; the MCP SDK gives a lost connection that code too.
    async with hostile_bob(pki, tmp_path) as bob:
        failed = await _reason(pki, bob, "h.failing", {})
        after = await _reason(pki, bob, "h.small", {"key": "k"})
        outcomes = await _outcomes(bob)
    assert (failed, after) == ("CAPABILITY_FAILED", "OK")
    assert outcomes == [("h.failing", "CAPABILITY_FAILED"), ("h.small", "OK")]
    assert len(_started_pids(tmp_path)) == 1  # neither dropped nor restarted


async def test_prompt_like_descriptions_are_shown_as_escaped_data(pki: Pki, tmp_path: Path) -> None:
    async with hostile_bob(pki, tmp_path, "--inject") as bob:
        lookup = bob.registry.resolve("h.lookup", VersionConstraint.parse(""))
    assert lookup is not None
    description = lookup.contract.description
    assert not has_unsafe_characters(description)
    assert "IGNORE ALL PREVIOUS INSTRUCTIONS" in description  # data, passed on as written
    assert "\\x1b[31m" in description and "\\u202e" in description


async def test_errors_and_stderr_of_a_server_are_never_quoted(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with hostile_bob(pki, tmp_path, "--stderr-flood") as bob:
        async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as peer:
            with pytest.raises(GatewayError) as leaky:
                await peer.invoke("h.leaky", {})
    assert leaky.value.reason == "CAPABILITY_FAILED"
    assert hostile.SECRET not in str(leaky.value)
    assert hostile.SECRET not in caplog.text
    assert "bytes to its standard error (dropped)" in caplog.text


@pytest.mark.parametrize(
    ("flags", "overrides", "reason", "problem"),
    [
        (("--unsupported",), {}, "CONFIG_INVALID", "its schema is not supported"),
        (
            (),
            {
                "tools": [
                    {
                        "tool": "absent",
                        "capability": "h.absent",
                        "version": "1.0.0",
                        "risk": "read",
                        "timeout": 1.0,
                    }
                ]
            },
            "CONFIG_INVALID",
            "lists no such tool",
        ),
        (("--mute",), {"start_timeout": 1.0}, "PEER_UNAVAILABLE", "did not answer within 1 s"),
        (
            (),
            {"command": "/nonexistent/mcp-server", "start_timeout": 1.0},
            "PEER_UNAVAILABLE",
            "did not answer within 1 s",
        ),
    ],
)
async def test_a_server_that_cannot_be_pinned_stops_the_start(
    pki: Pki,
    tmp_path: Path,
    flags: tuple[str, ...],
    overrides: dict[str, Any],
    reason: str,
    problem: str,
) -> None:
    with pytest.raises(GatewayError) as refused:
        await start_bob(pki, tmp_path, entry(tmp_path, *flags, **overrides))
    assert refused.value.reason == reason
    assert problem in str(refused.value)
    if reason == "CONFIG_INVALID":
        assert isinstance(refused.value, AgentConfigError)
    await asyncio.sleep(0.1)
    for pid in _started_pids(tmp_path):  # every server it started was stopped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# --- over Streamable HTTP -----------------------------------------------------


HTTP_TOOLS = ("big", "endless", "failing")


def hostile_http_app() -> Starlette:
    """A raw JSON-RPC HTTP server: a correct handshake and listing, then a 3 MiB answer
    (``big``), an event stream that never ends (``endless``) or a JSON-RPC error
    (``failing``)."""

    async def endpoint(request: Request) -> Response:
        message = await request.json()
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            return Response(status_code=202)
        if method == "initialize":
            return JSONResponse(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {
                        "protocolVersion": message["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "hostile-http", "version": "1"},
                    },
                }
            )
        if method == "tools/list":
            tools = [{"name": n, "inputSchema": {"type": "object"}} for n in HTTP_TOOLS]
            return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
        if method == "tools/call" and message["params"]["name"] == "big":
            text = "x" * (3 * 1024 * 1024)
            result = {"content": [{"type": "text", "text": text}]}
            return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": result})
        if method == "tools/call" and message["params"]["name"] == "failing":
            error = {"code": -32603, "message": hostile.SECRET}
            return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error})
        if method == "tools/call":

            async def forever() -> AsyncIterator[bytes]:
                while True:
                    yield b": keep waiting\r\n\r\n"
                    await asyncio.sleep(0.05)

            return StreamingResponse(forever(), media_type="text/event-stream")
        error = {"code": -32601, "message": "Method not found"}
        return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error})

    return Starlette(routes=[Route("/mcp", endpoint, methods=["POST"])])


@contextlib.asynccontextmanager
async def hostile_http_bob(pki: Pki, base: Path) -> AsyncIterator[Agent]:
    """bob fronting :func:`hostile_http_app`'s tools as ``hh.NAME`` (1 s timeout)."""
    async with served_app(hostile_http_app()) as port:
        upstream = {
            "name": "hostile-http",
            "url": f"http://127.0.0.1:{port}/mcp",
            "max_answer_bytes": 1024 * 1024,
            "tools": [
                {
                    "tool": name,
                    "capability": f"hh.{name}",
                    "version": "1.0.0",
                    "risk": "read",
                    "timeout": 1.0,
                }
                for name in HTTP_TOOLS
            ],
        }
        policy = write_policy(
            base / "bob-policy.toml", [grant("alice", [f"hh.{name}" for name in HTTP_TOOLS])]
        )
        plain = agent_config(pki, base, "bob", policy)
        config = AgentConfig.model_validate({**plain.model_dump(), "mcp_upstreams": [upstream]})
        bob = Agent(config, CapabilityRegistry())
        await bob.start(watch_policy=False)
        try:
            yield bob
        finally:
            await bob.stop(grace=0)


async def test_huge_and_endless_http_answers(pki: Pki, tmp_path: Path) -> None:
    async with hostile_http_bob(pki, tmp_path) as bob:
        big = await _reason(pki, bob, "hh.big", {})
        endless = await _reason(pki, bob, "hh.endless", {})
    assert (big, endless) == ("INVALID_OUTPUT", "CAPABILITY_TIMEOUT")


async def test_an_http_answer_cut_for_size_leaves_the_next_answers_their_own(
    pki: Pki, tmp_path: Path
) -> None:
    async with hostile_http_bob(pki, tmp_path) as bob:
        reasons = [await _reason(pki, bob, f"hh.{name}", {}) for name in ("big", "failing", "big")]
        outcomes = await _outcomes(bob)
    assert reasons == ["INVALID_OUTPUT", "CAPABILITY_FAILED", "INVALID_OUTPUT"]
    assert [reason for _, reason in outcomes] == reasons
