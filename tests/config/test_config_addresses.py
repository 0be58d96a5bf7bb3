"""Every ``host:port`` config value is checked at load: the port is in range, a host is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import EXIT_USAGE, main
from gateway.config import load_agent_config
from gateway.errors import AgentConfigError
from tests.helpers.agent_process import write_agent_toml
from tests.helpers.agents import Pki, write_policy

BAD_PORTS = [
    ("127.0.0.1:70001", "port 70001 is outside"),
    ("127.0.0.1:65536", "port 65536 is outside"),
    ("127.0.0.1:-1", "port '-1' is not a number"),
    ("127.0.0.1:abc", "port 'abc' is not a number"),
    ("127.0.0.1:", "port '' is not a number"),
    ("127.0.0.1:٣", "port '٣' is not a number"),  # a digit to str.isdigit, not to gRPC
    ("127.0.0.1", "expected host:port"),
    (":7001", "expected host:port"),
    ("", "expected host:port"),
    ("::1:7001", "an IPv6 host goes in brackets"),
]


def _config(tmp_path: Path, pki: Pki, *, listen: str = "127.0.0.1:0", extra: str = "") -> Path:
    path = write_agent_toml(
        tmp_path / "bob.toml",
        pki,
        "bob",
        listen=listen,
        policy=write_policy(tmp_path / "p.toml", []),
        audit_db=tmp_path / "a.sqlite",
        state_dir=tmp_path / "s",
    )
    # Top-level keys must come before the first table of the file.
    path.write_text(path.read_text() + extra)
    return path


def _problem(path: Path) -> str:
    with pytest.raises(AgentConfigError) as caught:
        load_agent_config(path)
    return caught.value.message


@pytest.mark.parametrize(("listen", "problem"), BAD_PORTS)
def test_a_bad_listen_address_names_file_key_and_problem(
    pki: Pki, tmp_path: Path, listen: str, problem: str
) -> None:
    path = _config(tmp_path, pki, listen=listen)
    message = _problem(path)
    assert message.startswith(f"{path}: listen: ")
    assert problem in message
    assert message.count("\n") == 0  # one problem, one line


@pytest.mark.parametrize(("listen", "problem"), BAD_PORTS)
def test_a_bad_metrics_listen_address_is_refused(
    pki: Pki, tmp_path: Path, listen: str, problem: str
) -> None:
    path = _config(tmp_path, pki, extra=f'[metrics]\nlisten = "{listen}"\n')
    message = _problem(path)
    assert message.startswith(f"{path}: metrics.listen: ")
    assert problem in message


@pytest.mark.parametrize(
    ("address", "problem"),
    [*BAD_PORTS, ("127.0.0.1:0", "port 0 is outside 1..65535")],
)
def test_a_bad_peer_address_is_refused(
    pki: Pki, tmp_path: Path, address: str, problem: str
) -> None:
    peer = f'[[peers]]\nid = "spiffe://example.org/agent/alice"\naddress = "{address}"\n'
    path = _config(tmp_path, pki, extra=peer)
    message = _problem(path)
    assert message.startswith(f"{path}: peers[0].address: ")
    assert problem in message


@pytest.mark.parametrize("endpoint", ["127.0.0.1:70001", "http://127.0.0.1:0", "collector"])
def test_a_bad_otlp_endpoint_is_refused(pki: Pki, tmp_path: Path, endpoint: str) -> None:
    path = _config(tmp_path, pki, extra=f'[tracing]\notlp_endpoint = "{endpoint}"\n')
    assert _problem(path).startswith(f"{path}: tracing.otlp_endpoint: ")


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:0", "127.0.0.1:65535", "[::1]:7001", "localhost:7001", "[::]:0"]
)
def test_good_listen_addresses_load(pki: Pki, tmp_path: Path, listen: str) -> None:
    metrics = f'[metrics]\nlisten = "{listen}"\nallow_remote = true\n'
    tracing = '[tracing]\notlp_endpoint = "http://127.0.0.1:4317"\n'
    config = load_agent_config(_config(tmp_path, pki, listen=listen, extra=metrics + tracing))
    assert config.listen == listen
    assert config.metrics is not None and config.metrics.listen == listen


def test_serve_refuses_an_out_of_range_port_before_binding(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, pki, listen="127.0.0.1:70001")
    assert main(["serve", "--config", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: listen: ")
    assert "port 70001 is outside 0..65535" in err
    assert not (tmp_path / "a.sqlite").exists()  # refused before anything was opened
