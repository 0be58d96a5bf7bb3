"""``[a2a] http_listen``: validated at load time, off when absent, one process only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import A2ASettings, AgentConfig


def config(**extra: Any) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "id": "spiffe://example.org/agent/alice",
            "tls": {"ca": Path("ca.pem"), "cert": Path("a.pem"), "key": Path("a.key")},
            "policy": Path("p.toml"),
            "audit_db": Path("a.sqlite"),
            "state_dir": Path("state"),
            **extra,
        }
    )


def test_off_when_absent() -> None:
    assert config().a2a.http_listen is None


@pytest.mark.parametrize("listen", ["127.0.0.1:7443", "localhost:0", "127.0.0.1:0", "[::1]:8443"])
def test_host_port_forms_are_accepted(listen: str) -> None:
    assert A2ASettings(http_listen=listen).http_listen == listen


@pytest.mark.parametrize("listen", ["127.0.0.1", "host:port", "host:70000", ""])
def test_anything_else_is_refused_at_load_time(listen: str) -> None:
    with pytest.raises(ValidationError, match="http_listen"):
        A2ASettings(http_listen=listen)


def test_workers_serve_the_https_port_too() -> None:
    loaded = config(a2a={"http_listen": "127.0.0.1:0"}, workers=2)
    assert (loaded.workers, loaded.a2a.http_listen) == (2, "127.0.0.1:0")


def test_the_public_url_must_be_https_without_a_path() -> None:
    assert (
        A2ASettings(http_url="https://agent.example:7443").http_url == "https://agent.example:7443"
    )
    assert A2ASettings(http_url="https://[::1]:7443").http_url == "https://[::1]:7443"
    wrongs = (
        "http://agent.example",
        "https://agent.example/",
        "https://agent.example/x?y=1",  # the card would list https://agent.example/x?y=1/a2a/...
        "https://agent example",
        "https://",
        "https://agent.example:99999",
        "https://u:pw@agent.example",
        "agent.example:7443",
    )
    for wrong in wrongs:
        with pytest.raises(ValidationError, match=r"http_url .*expected https://NAME\[:PORT\]"):
            A2ASettings(http_url=wrong)


def test_the_public_grpc_address_is_a_host_and_port() -> None:
    assert A2ASettings().grpc_address is None
    assert A2ASettings(grpc_address="agent.example:7000").grpc_address == "agent.example:7000"
    for wrong in ("agent.example", "agent.example:0", "agent.example:70000", "https://a:1"):
        with pytest.raises(ValidationError, match="grpc_address"):
            A2ASettings(grpc_address=wrong)


def test_v0_3_compat_is_on_by_default_and_only_a_bool() -> None:
    assert config().a2a.v0_3_compat is True
    assert config(a2a={"v0_3_compat": False}).a2a.v0_3_compat is False
    with pytest.raises(ValidationError, match="v0_3_compat"):
        config(a2a={"v0_3_compat": "sometimes"})


def test_stream_send_timeout_is_30_s_by_default_and_a_positive_finite_number() -> None:
    assert config().a2a.stream_send_timeout == 30.0
    assert config(a2a={"stream_send_timeout": 2.5}).a2a.stream_send_timeout == 2.5
    for wrong in (0, -1, float("inf"), float("nan"), 3601, "soon"):
        with pytest.raises(ValidationError, match="stream_send_timeout"):
            config(a2a={"stream_send_timeout": wrong})
