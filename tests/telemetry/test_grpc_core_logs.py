"""gRPC core's raw stderr lines never reach a served agent's log (a forged SNI stays out)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from gateway.telemetry.grpc_core_logs import quiet_grpc_core
from tests.helpers.agent_process import AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, grant, write_policy

# A newline, a JSON object that looks like one of our events, an ESC sequence.
FORGED_SERVER_NAME = 'x\n{"level":"ERROR","event":"forged"}\x1b[31mred'


def _verbose_without_grpc_verbosity(args: list[str], **kw: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    args = [*args[:3], "-v", *args[3:]]  # INFO: our own events are on stderr too
    return subprocess.Popen(args, text=True, env=env, **kw)  # type: ignore[call-overload, no-any-return]


def _handshake(address: str, server_name: str, ca: Path) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False  # the name is the attack; the server's reply is not the point
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        assert tls.version() is not None  # the handshake reached the server's TLS stack


@pytest.mark.slow
def test_a_forged_server_name_never_becomes_a_raw_stderr_line(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=tmp_path / "alice-audit.db",
        state_dir=tmp_path / "alice-state",
    )
    agent = AgentProcess(config, launch=_verbose_without_grpc_verbosity)
    try:
        address = agent.start()
        for _ in range(3):
            _handshake(address, FORGED_SERVER_NAME, pki.dir / "ca.pem")
        assert agent.terminate() == 0
    finally:
        agent.kill()
    stderr = agent.errors(wait=10)

    assert "\x1b" not in stderr
    events = [json.loads(line) for line in stderr.splitlines()]  # every line is one event
    assert events, "the agent logged nothing at INFO: the check above proved nothing"
    assert all(set(event) >= {"time", "level", "logger", "event"} for event in events)
    assert all(event["event"] != "forged" for event in events)


def test_an_operator_choice_of_grpc_verbosity_is_kept() -> None:
    chosen = {"GRPC_VERBOSITY": "DEBUG"}
    quiet_grpc_core(chosen)
    unset: dict[str, str] = {}
    quiet_grpc_core(unset)
    assert (chosen, unset) == ({"GRPC_VERBOSITY": "DEBUG"}, {"GRPC_VERBOSITY": "NONE"})
