"""A start that fails half way stops what it started: no thread, no port, no lock left.

The HTTPS bindings start after the audit writer thread, the stores, the
telemetry and the gRPC server. When their port is taken, ``serve`` used to
leave all of those running (in a process that went on, e.g. a test calling
``main``); now the agent stops them in reverse and ``serve`` exits 2 with one
``error:`` line, as it does for a taken gRPC port.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.main import EXIT_USAGE, main
from gateway.client.peer_client import PeerClient
from gateway.config import load_agent_config
from gateway.errors import AddressUnavailable
from gateway.runtime.agent import Agent
from gateway.runtime.instance_lock import InstanceLock
from tests.agent_process import write_agent_toml
from tests.runtime.leftovers import listening_ports, threads_left
from tests.support import Pki, audit_rows, grant, spiffe, write_policy

REPO = Path(__file__).parents[2]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another listener holds for the test."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alice(
    pki: Pki,
    tmp_path: Path,
    *,
    grpc_port: int,
    https_port: int,
    metrics_port: int = 0,
    console_port: int = 0,
) -> Path:
    """alice's config: gRPC and A2A over HTTPS on the given ports, metrics and console on."""
    toml = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen=f"127.0.0.1:{grpc_port}",
        policy=write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])]),
        audit_db=tmp_path / "audit.sqlite",
        state_dir=tmp_path / "state",
    )
    toml.write_text(
        toml.read_text()
        + f'\n[a2a]\nhttp_listen = "127.0.0.1:{https_port}"\n'
        + f'\n[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
        + f'\n[console]\nlisten = "127.0.0.1:{console_port}"\n'
    )
    return toml


@pytest.mark.parametrize("taken", ["https", "grpc", "metrics", "console"])
def test_serve_on_a_taken_port_exits_2_with_one_error_line_and_leaves_nothing_running(
    pki: Pki, tmp_path: Path, capfd: pytest.CaptureFixture[str], held_port: int, taken: str
) -> None:
    grpc_port = held_port if taken == "grpc" else _free_port()
    ports_of = {name: held_port if taken == name else 0 for name in ("metrics", "console")}
    config = _alice(
        pki,
        tmp_path,
        grpc_port=grpc_port,
        https_port=held_port if taken == "https" else 0,
        metrics_port=ports_of["metrics"],
        console_port=ports_of["console"],
    )
    threads, ports = set(threading.enumerate()), listening_ports()
    capfd.readouterr()

    assert main(["serve", "--config", str(config)]) == EXIT_USAGE

    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    in_use = "[Errno 98] Address already in use"
    assert errors == [
        {
            "https": f"error: could not listen on 127.0.0.1:{held_port} for A2A over HTTPS: "
            + in_use,
            "grpc": f"error: listen 127.0.0.1:{held_port}: cannot bind (another process "
            "listens there, or the address is not on this host)",
            "metrics": f"error: metrics: cannot listen on 127.0.0.1:{held_port}: {in_use}",
            "console": f"error: console: cannot listen on 127.0.0.1:{held_port}: {in_use}",
        }[taken]
    ]
    # No audit writer, gRPC poller, span exporter or executor thread goes on running,
    # no listener (gRPC, metrics, console) stays bound, the state lock is free again.
    assert threads_left(threads) == []
    assert listening_ports() == ports
    with socket.socket() as again:
        again.bind(("127.0.0.1", grpc_port if taken == "https" else _free_port()))
    InstanceLock.acquire(tmp_path / "state").release()


def test_serve_in_its_own_process_says_one_line_and_exits_2(
    pki: Pki, tmp_path: Path, held_port: int
) -> None:
    config = _alice(pki, tmp_path, grpc_port=0, https_port=held_port)
    served = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert served.returncode == EXIT_USAGE
    assert served.stdout == ""
    assert served.stderr == (
        f"error: could not listen on 127.0.0.1:{held_port} for A2A over HTTPS: "
        "[Errno 98] Address already in use\n"
    )


async def test_after_a_failed_start_the_same_config_starts_and_serves(
    pki: Pki, tmp_path: Path
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    https_port = holder.getsockname()[1]
    config = load_agent_config(_alice(pki, tmp_path, grpc_port=0, https_port=https_port))
    refused = Agent(config)
    with pytest.raises(AddressUnavailable) as raised:
        await refused.start(watch_policy=False)
    assert raised.value.reason == "ADDRESS_UNAVAILABLE"
    assert not refused.audit.healthy  # opened, then closed again by the unwinding
    assert refused.health_state().started is False
    await refused.stop()  # nothing left to stop
    holder.close()  # the port is free now: the stores, the log and the ports were let go
    agent = Agent(config)
    await agent.start(watch_policy=False)
    try:
        async with PeerClient(config.id, agent.address, pki.material("bob")) as bob:
            answer = await bob.invoke("text.echo", {"text": "second start"})
        assert answer.output() == {"text": "second start"}
        assert agent.https_url == f"https://127.0.0.1:{https_port}"
    finally:
        await agent.stop()
    assert [(r.capability, r.decision, r.peer_id) for r in audit_rows(config.audit_db)] == [
        ("text.echo", "allow", spiffe("bob"))
    ]
