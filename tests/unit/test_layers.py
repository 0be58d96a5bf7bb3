"""The layers of the package import only downward (checked in fresh interpreters)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after_import(*modules: str) -> set[str]:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print('\\n'.join(sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize("package", ["policies", "capabilities", "gateway.errors"])
def test_policy_and_capability_layers_do_not_pull_in_grpc(package: str) -> None:
    loaded = _modules_after_import(package)
    assert not {m for m in loaded if m == "grpc" or m.startswith("grpc.")}
    assert not {m for m in loaded if m.startswith(("gateway.transport", "gateway.server"))}


def test_the_serving_runtime_never_imports_developer_tools() -> None:
    loaded = _modules_after_import(
        "gateway.agent",
        "gateway.server.grpc_server",
        "gateway.client.peer_client",
        "gateway.inbound.invoke_handler",
        "gateway.outbound.router",
        "gateway.plans.executor",
        "gateway.audit",
    )
    assert "gateway.agent" in loaded
    assert not {m for m in loaded if m.startswith("gateway.devtools")}


def test_only_the_transport_edge_imports_the_a2a_sdk() -> None:
    loaded = _modules_after_import(
        "gateway.inbound.invoke_handler",
        "gateway.inbound.pipeline",
        "gateway.outbound.router",
        "gateway.plans.executor",
        "gateway.audit",
        "gateway.config",
        "policies",
        "capabilities",
    )
    assert "gateway.inbound.invoke_handler" in loaded
    assert not {m for m in loaded if m == "a2a" or m.startswith("a2a.")}


def test_the_a2a_sdk_lives_only_at_the_a2a_edges() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    importers = sorted(
        str(path.relative_to(root))
        for package in ("gateway", "policies", "capabilities")
        for path in (root / package).rglob("*.py")
        if any(
            line.startswith(("from a2a", "import a2a")) for line in path.read_text().splitlines()
        )
    )
    assert importers
    edge = (
        "gateway/server/a2a/",  # serving the gRPC binding
        "gateway/server/a2a_http/",  # serving the HTTP bindings
        "gateway/client/a2a/",  # calling upstream A2A agents
    )
    assert all(path.startswith(edge) for path in importers), importers
