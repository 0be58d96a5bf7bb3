"""What the supervisor of ``workers > 1`` learns from worker 0 and tells the others: the ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.config import AgentConfig
from gateway.errors import AddressUnavailable, AgentConfigError
from gateway.runtime.worker_ports import (
    WorkerReady,
    check_ports_free,
    parse_ready_line,
    ready_line,
    worker_config,
)


def _config(tmp_path: Path, listen: str, http_listen: str | None) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "id": "spiffe://example.org/agent/alice",
            "listen": listen,
            "policy": tmp_path / "policy.toml",
            "audit_db": tmp_path / "audit.sqlite",
            "state_dir": tmp_path / "state",
            "workers": 2,
            "tls": {
                "ca": tmp_path / "ca.pem",
                "cert": tmp_path / "a.pem",
                "key": tmp_path / "a.key",
            },
            "a2a": {"http_listen": http_listen},
        }
    )


def test_the_ready_line_names_both_ports_when_https_is_served() -> None:
    line = ready_line(0, "127.0.0.1:7001", "https://localhost:7443")
    assert line == "worker 0 ready on 127.0.0.1:7001 https on https://localhost:7443"
    assert parse_ready_line(line + "\n") == WorkerReady(7001, "https://localhost:7443")
    assert parse_ready_line(line + "\n").https_port == 7443  # type: ignore[union-attr]
    plain = parse_ready_line(ready_line(1, "[::1]:7001", "") + "\n")
    assert plain == WorkerReady(7001, "") and plain.https_port == 0
    assert parse_ready_line("worker 1 pid 4242\n") is None


def test_a_worker_binds_the_ports_the_supervisor_resolved(tmp_path: Path) -> None:
    config = _config(tmp_path, "[::1]:0", "localhost:0")
    bound = worker_config(config, 7001, 7443)
    assert (bound.listen, bound.a2a.http_listen) == ("[::1]:7001", "localhost:7443")
    assert worker_config(config, None, None) == config
    without = _config(tmp_path, "127.0.0.1:0", None)
    assert worker_config(without, 7001, 7443).a2a.http_listen is None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_https_on_the_grpc_address_is_refused_before_any_worker_shares_it() -> None:
    port = _free_port()
    with pytest.raises(AgentConfigError, match=f"http_listen 127.0.0.1:{port} is the address of"):
        check_ports_free([("listen", "127.0.0.1", port), ("a2a.http_listen", "127.0.0.1", port)])


def test_a_port_another_process_listens_on_is_refused_by_its_setting() -> None:
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        taken = foreign.getsockname()[1]
        with pytest.raises(AddressUnavailable, match=f"a2a.http_listen 127.0.0.1:{taken}"):
            check_ports_free([("listen", "127.0.0.1", 0), ("a2a.http_listen", "127.0.0.1", taken)])
    check_ports_free([("listen", "127.0.0.1", 0), ("a2a.http_listen", "127.0.0.1", 0)])


def test_mcp_on_the_https_address_is_refused_too() -> None:
    port = _free_port()
    served = [
        ("listen", "127.0.0.1", 0),
        ("a2a.http_listen", "127.0.0.1", port),
        ("mcp.listen", "127.0.0.1", port),
    ]
    with pytest.raises(
        AgentConfigError,
        match=rf"mcp\.listen 127\.0\.0\.1:{port} is the address of a2a\.http_listen",
    ):
        check_ports_free(served)
