"""compose() wires an agent without I/O; a test may start only the services it needs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, ConsoleSettings, MetricsSettings
from gateway.errors import UnknownPeer
from gateway.runtime.compose import compose
from gateway.runtime.inputs import Inputs, load_capabilities, read_identity
from gateway.runtime.parts import Parts
from gateway.runtime.service_stack import ServiceStack
from gateway.runtime.services import agent_services
from gateway.storage import open_stores
from gateway.telemetry import Telemetry
from policies.store import PolicyStore
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    write_policy,
)
from tests.helpers.leftovers import listening_ports


def _config(pki: Pki, tmp_path: Path) -> AgentConfig:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    return agent_config(pki, tmp_path, "alice", policy)


def _inputs(config: AgentConfig, tmp_path: Path, telemetry: Telemetry | None = None) -> Inputs:
    live_tls, workload_api = read_identity(config)
    registry = load_capabilities(config, standard_registry(WriteCounter(), tmp_path / "caps"))
    return Inputs(
        live_tls,
        workload_api,
        PolicyStore(config.policy),
        registry,
        telemetry or Telemetry.off(config.id),
        open_stores(config),
    )


def _close_stores(parts: Parts) -> None:
    for store in (parts.idempotency, parts.replay, parts.plan_tasks, parts.a2a_tasks):
        store.close()


def _files(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.rglob("*"))


async def test_compose_opens_no_file_socket_or_thread(pki: Pki, tmp_path: Path) -> None:
    config = AgentConfig.model_validate(
        {
            **_config(pki, tmp_path).model_dump(),
            "a2a": {"http_listen": "127.0.0.1:0"},
            "console": ConsoleSettings(listen="127.0.0.1:0"),
            "metrics": MetricsSettings(listen="127.0.0.1:0"),
            "audit_checkpoints": {"every_records": 1},
        }
    )
    inputs = _inputs(config, tmp_path, Telemetry(config.id, config.metrics))
    files, threads, ports = _files(tmp_path), threading.enumerate(), listening_ports()

    parts = compose(config, inputs)

    # Nothing new: a thread or port an earlier test leaves ending meanwhile is not compose's.
    assert _files(tmp_path) == files
    assert set(threading.enumerate()) - set(threads) == set()
    assert listening_ports() - ports == set()
    assert not config.audit_db.exists()  # opened by the audit log's start, not before
    assert parts.https is not None and parts.console is not None
    assert parts.checkpoints is not None
    assert parts.endpoints.grpc_port == parts.endpoints.https_port == 0
    _close_stores(parts)


async def test_an_agent_of_only_the_grpc_server_handler_and_audit_serves_and_audits(
    pki: Pki, tmp_path: Path
) -> None:
    config = _config(pki, tmp_path)
    parts = compose(config, _inputs(config, tmp_path))
    wanted = {"audit log", "calls in flight", "gRPC server"}
    services = [s for s in agent_services(parts, watch_policy=False) if s.name in wanted]
    stack = ServiceStack()
    ports = listening_ports()
    async with stack.starting():
        await stack.enter_all(services)
    try:
        assert stack.names == ("audit log", "calls in flight", "gRPC server")
        assert listening_ports() - ports == {parts.endpoints.grpc_port}  # no HTTPS, console
        assert parts.telemetry.metrics_address is None  # nor /metrics
        async with PeerClient(config.id, parts.endpoints.address, pki.material("bob")) as bob:
            answer = await bob.invoke("text.echo", {"text": "only what it needs"})
            assert json.loads(answer.payload) == {"text": "only what it needs"}
        async with PeerClient(config.id, parts.endpoints.address, pki.material("carol")) as carol:
            with pytest.raises(UnknownPeer):  # carol has no grant: refused, and audited
                await carol.invoke("text.echo", {"text": "x"})
    finally:
        await stack.stop(grace=1.0)
        _close_stores(parts)
    assert listening_ports() == ports
    rows = audit_rows(config.audit_db)
    assert [(r.peer_id, r.capability, r.decision) for r in rows] == [
        (spiffe("bob"), "text.echo", "allow"),
        (spiffe("carol"), "text.echo", "refuse"),
    ]


async def test_the_stop_order_keeps_the_shutdown_promises(pki: Pki, tmp_path: Path) -> None:
    """Reversed, the start order is the stop order: each pair below is (stops first, later)."""
    config = AgentConfig.model_validate(
        {
            **_config(pki, tmp_path).model_dump(),
            "a2a": {"http_listen": "127.0.0.1:0"},
            "console": ConsoleSettings(listen="127.0.0.1:0"),
        }
    )
    parts = compose(config, _inputs(config, tmp_path))
    stopping = [service.name for service in reversed(agent_services(parts))]
    assert stopping[0] == "health"  # NOT_SERVING from the first moment
    for first, later in [
        ("console", "serving status"),
        ("serving status", "plans"),
        ("plans", "A2A runs"),
        # streams of running A2A tasks end while the servers still carry them
        ("A2A runs", "A2A HTTPS bindings"),
        ("policy watcher", "A2A HTTPS bindings"),
        ("limit refusal flush loop", "A2A HTTPS bindings"),
        ("A2A HTTPS bindings", "gRPC server"),
        # cancelled calls queue their CANCELLED record before the log closes
        ("gRPC server", "calls in flight"),
        ("calls in flight", "limit refusal log"),
        ("limit refusal log", "A2A task recovery"),  # counted refusals reach the log
        ("A2A task recovery", "peer clients"),
        ("peer clients", "audit log"),
        ("audit log", "metrics endpoint"),
    ]:
        assert stopping.index(first) < stopping.index(later), (first, later)
    assert stopping[-1] == "metrics endpoint"  # its listener closes with the telemetry
    _close_stores(parts)
