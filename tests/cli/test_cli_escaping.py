"""CLI errors and file messages are escaped: no peer or file can drive the operator's terminal."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from gateway.display import has_unsafe_characters
from gateway.errors import CapabilityNotGranted
from gateway.transport.status import to_grpc_status
from gateway.transport.tls import server_options
from gateway.wire.v1 import gateway_pb2
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, spiffe
from tests.helpers.cli import run_cli_async

HOSTILE = "no\n2026-01-01T00:00:00Z allowed\r\x1b[2J\x1b]0;owned\x07 \u202eetirw\x85\u2028done"


async def _run_cli(*args: str) -> tuple[int, str, str]:
    result = await run_cli_async(*args)
    return result.returncode, result.stdout, result.stderr


@asynccontextmanager
async def hostile_alice(pki: Pki, tmp_path: Path) -> AsyncIterator[Path]:
    """A real mTLS server holding alice's SVID whose every text is written to forge
    lines and drive a terminal; yields bob's config naming it as peer alice."""

    async def refuse(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        await context.abort_with_status(to_grpc_status(CapabilityNotGranted(HOSTILE)))
        raise AssertionError("unreachable")

    async def describe(
        request: gateway_pb2.DescribeRequest, context: aio.ServicerContext[Any, Any]
    ) -> gateway_pb2.DescribeResponse:
        response = gateway_pb2.DescribeResponse(
            agent_id=spiffe("alice") + HOSTILE, protocol_version="a2agw.v1\x1b[1A"
        )
        response.capabilities.add(
            name="text.echo", version="1.0.0\r", risk="read", description=HOSTILE
        )
        response.capabilities.add(
            name="kv\u202eput", version="1.0.0", risk="write\n", description="ok"
        )
        return response

    handlers = {
        "Invoke": grpc.unary_unary_rpc_method_handler(refuse),
        "Describe": grpc.unary_unary_rpc_method_handler(
            describe,
            request_deserializer=gateway_pb2.DescribeRequest.FromString,
            response_serializer=gateway_pb2.DescribeResponse.SerializeToString,
        ),
    }
    server = aio.server(options=server_options())
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("a2agw.v1.PeerGateway", handlers),)
    )
    port = server.add_secure_port("127.0.0.1:0", pki.material("alice").server_credentials())
    await server.start()
    try:
        yield write_agent_toml(
            tmp_path / "bob.toml",
            pki,
            "bob",
            listen="127.0.0.1:0",
            policy=tmp_path / "unused.toml",
            audit_db=tmp_path / "bob-audit.sqlite",
            state_dir=tmp_path / "bob-state",
            peers=[("alice", f"127.0.0.1:{port}")],
        )
    finally:
        await server.stop(0)


async def test_a_peers_refusal_message_is_printed_as_one_escaped_line(
    pki: Pki, tmp_path: Path
) -> None:
    async with hostile_alice(pki, tmp_path) as config:
        code, _, err = await _run_cli(
            "call",
            "--config",
            str(config),
            "--peer",
            spiffe("alice"),
            "text.echo",
            "--input",
            '{"text": "x"}',
        )
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("refused: CAPABILITY_NOT_GRANTED: no\\x0a2026")
    assert not has_unsafe_characters(err.replace("\n", ""))
    assert "\\x1b[2J" in err and "\\u202eetirw" in err


async def test_a_peers_description_is_printed_escaped(pki: Pki, tmp_path: Path) -> None:
    async with hostile_alice(pki, tmp_path) as config:
        code, out, err = await _run_cli(
            "describe", "--config", str(config), "--peer", spiffe("alice")
        )
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3  # the agent line and one per capability
    assert not has_unsafe_characters(out.replace("\n", ""))
    assert lines[1].startswith("  text.echo@1.0.0\\x0d") and lines[2].startswith("  kv\\u202eput@")


async def test_a_path_with_controls_in_an_error_is_escaped(tmp_path: Path) -> None:
    odd = tmp_path / "log\n\x1b[31mfake error\u202e.sqlite"
    code, _, err = await _run_cli("audit", "--db", str(odd))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "log\\x0a\\x1b[31mfake error\\u202e.sqlite" in err


async def test_policy_check_problems_are_one_escaped_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text(
        '[[grants]]\n"k\\u001b[2J\\n\\u202eforged" = 1\npeer = "spiffe://e.org/\\u2066a"\n'
        "capabilities = []\nmax_payload_bytes = 1\nexpires_at = 2030-01-01T00:00:00Z\n"
    )
    code, _, err = await _run_cli("policy", "check", str(bad))
    assert code == 2
    lines = err.split("\n")[:-1]
    assert len(lines) == 2 and lines[0].startswith(f"error: {bad}: grants[0]")
    assert lines[1].startswith(f"  {bad}: grants[0]")
    assert not has_unsafe_characters(err.replace("\n", ""))
    assert "k\\x1b[2J\\x0a\\u202eforged" in err and "\\u2066a" in err


async def _log_through_the_cli(log_format: str) -> str:
    # main() installs the logging setup for every command; log afterwards
    # exactly as library code would, with a peer-chosen id as the argument.
    code = (
        "import logging, sys\n"
        "from gateway.cli.main import main\n"
        f"main(['-v', '--log-format', '{log_format}', 'audit', 'verify', '--db', sys.argv[1]])\n"
        "logging.getLogger('gateway.test').warning('step %s failed', sys.argv[2])\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        "/nonexistent/audit.sqlite",
        "s1\nERROR forged\x1b[2J\u202e",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err_bytes = await asyncio.wait_for(process.communicate(), 60)
    return err_bytes.decode()


async def test_the_cli_logging_setup_escapes_every_record() -> None:
    err = await _log_through_the_cli("text")
    lines = err.splitlines()
    assert lines[-1].endswith(
        "WARNING gateway.test: step s1\\x0aERROR forged\\x1b[2J\\u202e failed"
    )
    assert not has_unsafe_characters(err.replace("\n", ""))


async def test_json_logs_keep_a_forged_line_inside_one_event() -> None:
    err = await _log_through_the_cli("json")
    last = json.loads(err.splitlines()[-1])
    assert (last["level"], last["logger"]) == ("WARNING", "gateway.test")
    assert last["event"] == "step s1\nERROR forged\x1b[2J\u202e failed"
    assert not has_unsafe_characters(err.replace("\n", ""))
