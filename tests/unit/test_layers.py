"""The layers of the package import only downward: by their sources (``layer_order``, every
import statement) and in fresh interpreters (what an import really loads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit import layer_order


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
        "gateway.runtime.agent",
        "gateway.server.grpc_server",
        "gateway.client.peer_client",
        "gateway.inbound.invoke_handler",
        "gateway.outbound.router",
        "gateway.plans.execution.executor",
        "gateway.audit",
    )
    assert "gateway.runtime.agent" in loaded
    assert not {m for m in loaded if m.startswith("gateway.devtools")}


def test_only_the_transport_edge_imports_the_a2a_sdk() -> None:
    loaded = _modules_after_import(
        "gateway.inbound.invoke_handler",
        "gateway.inbound.pipeline",
        "gateway.outbound.router",
        "gateway.plans.execution.executor",
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


# --- the order between layers (tests/unit/layer_order.py) -----------------------------

KNOWN_UPWARD: set[tuple[str, str]] = set()
"""Upward imports tolerated until the change named beside them lands (none left): add one
only with the change that removes it named beside it, and remove it then."""


def _root() -> Path:
    return Path(__file__).resolve().parents[2]


def test_every_module_sits_in_a_layer() -> None:
    sources = layer_order.package_sources(_root())
    assert "gateway.server.grpc_server" in sources
    assert layer_order.unplaced(sources) == []


def test_every_import_points_down_the_layers() -> None:
    sources = layer_order.package_sources(_root())
    found = layer_order.violations(sources, KNOWN_UPWARD)
    assert not found, "imports of a higher layer:\n" + "\n".join(map(str, found))


def test_each_tolerated_upward_import_still_exists() -> None:
    sources = layer_order.package_sources(_root())
    present = {(v.importer, v.imported) for v in layer_order.violations(sources)}
    stale = KNOWN_UPWARD - present
    assert not stale, f"gone, remove from KNOWN_UPWARD: {sorted(stale)}"


@pytest.mark.parametrize(
    ("planted", "imported"),
    [
        ("import gateway.server.grpc_server", "gateway.server.grpc_server"),
        ("from gateway.plans.execution import executor", "gateway.plans.execution.executor"),
        ("from gateway.inbound.pipeline import Pipeline", "gateway.inbound.pipeline"),
        ("from ..client import peer_client", "gateway.client.peer_client"),
    ],
)
def test_a_planted_upward_import_is_named_with_its_file_and_line(
    planted: str, imported: str
) -> None:
    sources = layer_order.package_sources(_root())
    path, text, is_package = sources["gateway.transport.tls"]
    lines = text.splitlines()
    planted_text = "\n".join([*lines, "", "", "def _planted() -> None:", f"    {planted}", ""])
    sources["gateway.transport.tls"] = (path, planted_text, is_package)

    found = layer_order.violations(sources, KNOWN_UPWARD)

    assert [(v.path, v.line, v.importer, v.imported) for v in found] == [
        ("gateway/transport/tls.py", len(lines) + 4, "gateway.transport.tls", imported)
    ]
    assert str(found[0]).startswith(f"gateway/transport/tls.py:{len(lines) + 4}: ")


def test_a_downward_or_same_layer_import_is_not_a_violation() -> None:
    sources = {
        "gateway.server.grpc_server": ("a.py", "from gateway.inbound import call\n", False),
        "gateway.server.health": ("b.py", "import gateway.server.grpc_server\n", False),
        "gateway.inbound.call": ("c.py", "from gateway.errors import GatewayError\n", False),
        "gateway.inbound": ("gateway/inbound/__init__.py", "", True),
        "gateway.errors": ("e.py", "", False),
    }
    assert layer_order.violations(sources) == []


def test_the_error_tree_and_display_helpers_import_nothing_of_ours() -> None:
    for module in ("gateway.errors", "gateway.display"):
        path = _root() / (module.replace(".", "/") + ".py")
        ours = [
            name
            for name, _ in layer_order.imports_of(path.read_text(), module, is_package=False)
            if name.split(".")[0] in layer_order.ROOT_PACKAGES
        ]
        assert ours == [], (module, ours)


def test_importing_policies_or_capabilities_loads_only_the_leaves_of_gateway() -> None:
    for package in ("policies", "capabilities", "gateway.errors", "gateway.display"):
        loaded = _modules_after_import(package)
        ours = {m for m in loaded if m == "gateway" or m.startswith("gateway.")}
        leaves = {"gateway", "gateway.errors", "gateway.display"}
        local = {
            "gateway.local",
            "gateway.local.regular_files",
            "gateway.local.toml_files",
            "gateway.local.toml_problems",  # what toml_files says of a problem
        }
        assert ours <= leaves | local, ours
    assert {m for m in _modules_after_import("gateway") if m.startswith("gateway")} == {"gateway"}


def test_the_package_still_offers_the_error_root_lazily() -> None:
    import gateway
    import gateway.errors

    assert gateway.GatewayError is gateway.errors.GatewayError
    assert gateway.ERROR_DOMAIN == gateway.errors.ERROR_DOMAIN
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = gateway.no_such_name  # type: ignore[attr-defined]
