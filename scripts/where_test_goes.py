"""Where a test goes and how it is marked: a proposal for each test module named.

    python scripts/where_test_goes.py tests/integration/mcp/      # a folder from a branch
    python scripts/where_test_goes.py tests/unit/test_worker_ports.py
    python scripts/where_test_goes.py gateway/server/mcp/edge.py  # a module to test

For a test module it proposes the folder that mirrors the package it tests (the package
it imports most, leaving out what every test imports), the imports of other test modules
to move into tests/helpers/, the tier marker it needs, and what else to check. It only
prints; the rules themselves are tests/test_suite_layout.py's.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.tiers import FOLDER_MARKERS, PROCESS_STARTERS, SUITES  # noqa: E402

COMMON = (
    "gateway.config",
    "gateway.errors",
    "gateway.display",
    "gateway.runtime.agent",
    "gateway.client.peer_client",
    "gateway.devtools",
    "capabilities.registry",
    "capabilities.versions",
    "capabilities.contract",
    "policies.identity",
)
"""Imports of nearly every test: they say nothing about what a module tests."""

MOVED = {
    "tests.a2a_client_script": "tests.helpers.a2a_client_script",
    "tests.a2a_conversing_upstream": "tests.helpers.a2a_conversing_upstream",
    "tests.a2a_hostile_upstream": "tests.helpers.a2a_hostile_upstream",
    "tests.a2a_http_client_script": "tests.helpers.a2a_http_client_script",
    "tests.a2a_http_support": "tests.helpers.a2a_http",
    "tests.a2a_stream_client_script": "tests.helpers.a2a_stream_client_script",
    "tests.a2a_support": "tests.helpers.a2a_grpc",
    "tests.a2a_upstream": "tests.helpers.a2a_upstream",
    "tests.agent_process": "tests.helpers.agent_process",
    "tests.conversation_capabilities": "tests.helpers.conversation_capabilities",
    "tests.deploy.podman_lab": "tests.helpers.podman_lab",
    "tests.docs.prose": "tests.helpers.prose",
    "tests.docs.run_python_snippet": "tests.helpers.run_python_snippet",
    "tests.docs.snippets": "tests.helpers.snippets",
    "tests.faults.crash_window": "tests.helpers.crash_window",
    "tests.faults.ledger_write": "tests.helpers.ledger_write",
    "tests.faults.peer_caller": "tests.helpers.peer_caller",
    "tests.faults.plan_support": "tests.helpers.plan_capabilities",
    "tests.faults.worker_pid": "tests.helpers.worker_pid",
    "tests.identity.issuer": "tests.helpers.token_issuer",
    "tests.integration.mcp.hostile_stdio_server": "tests.helpers.mcp_hostile_stdio_server",
    "tests.integration.mcp.mcp_support": "tests.helpers.mcp",
    "tests.integration.mcp.sdk_tool_server": "tests.helpers.mcp_sdk_tool_server",
    "tests.interop.mcp_served_capabilities": "tests.helpers.mcp_served_capabilities",
    "tests.interop.node_projects": "tests.helpers.node_projects",
    "tests.interop.served_agent": "tests.helpers.served_agent",
    "tests.netns": "tests.helpers.netns",
    "tests.netproxy": "tests.helpers.netproxy",
    "tests.postgres": "tests.helpers.postgres",
    "tests.push_receiver": "tests.helpers.push_receiver",
    "tests.rotation.rotation_support": "tests.helpers.rotation",
    "tests.runtime.leftovers": "tests.helpers.leftovers",
    "tests.security.a2a_fuzz": "tests.helpers.a2a_fuzz",
    "tests.security.forged_certs": "tests.helpers.forged_certs",
    "tests.spire.spire_lab": "tests.helpers.spire_lab",
    "tests.support": "tests.helpers.agents",
    "tests.task_capabilities": "tests.helpers.task_capabilities",
    "tests.telemetry.exposition": "tests.helpers.exposition",
    "tests.unit.layer_order": "tests.helpers.layer_order",
}
"""Support modules as branches from before the test layout name them, and their new names."""


def package_folder(module: str) -> Path | None:
    """The deepest folder of the package that ``module`` (dotted) lives in."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        folder = REPO.joinpath(*parts[:end])
        if folder.is_dir() and (folder / "__init__.py").is_file():
            return folder
    return None


def test_folder_of(folder: Path) -> str:
    """``gateway/server/mcp`` -> ``tests/server/mcp``; ``policies`` -> ``tests/policies``."""
    parts = folder.relative_to(REPO).parts
    return "/".join(("tests", *(parts[1:] if parts[0] == "gateway" else parts)))


def imports_of(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _exists(parts: list[str]) -> bool:
    path = REPO.joinpath(*parts)
    return path.with_suffix(".py").is_file() or path.is_dir()


def _named_in(path: Path, folder: Path) -> int:
    """1 when the test module's name holds the package folder's name (``test_mcp_edge``)."""
    return int(folder.name in path.stem.split("_"))


def proposal(path: Path) -> list[str]:
    """What to do with the test module at ``path``, one line each."""
    text, rel = path.read_text(), path.resolve().relative_to(REPO)
    modules = imports_of(path)
    lines: list[str] = []
    suite = rel.parts[1] if len(rel.parts) > 2 and rel.parts[1] in SUITES else None
    if suite is not None:
        lines.append(f"stays in tests/{suite}/ ({SUITES[suite]})")
    else:
        tested = Counter(
            folder
            for module in modules
            if module.split(".")[0] in ("gateway", "capabilities", "policies")
            and not module.startswith(COMMON)
            and (folder := package_folder(module)) is not None
            and folder != REPO / "gateway"
        )
        if tested:
            best = max(
                tested.items(),
                key=lambda item: (_named_in(path, item[0]), item[1], len(item[0].parts)),
            )[0]
            others = ", ".join(test_folder_of(f) for f, _ in tested.most_common(4) if f != best)
            lines.append(
                f"goes to {test_folder_of(best)}/{path.name}"
                + (f" (it also imports what {others} test)" if others else "")
            )
        else:
            lines.append("imports no package beyond the common ones: place it by hand")
        words = set(path.stem.split("_")) | set(rel.parts[1:-1])
        named = sorted(
            test_folder_of(folder)
            for folder in (REPO / "gateway").rglob("*")
            if folder.is_dir() and folder.name in words and (folder / "__init__.py").is_file()
        )
        if named:
            lines.append(f"its name or folder says {' or '.join(named)}: pick by what it calls")
    for module in sorted({m for m in modules if m.startswith("tests.")}):
        parts = module.split(".")
        if module.rsplit(".", 1)[0] in modules and module.rsplit(".", 1)[0] != "tests":
            continue  # ``from a import b``: ``a`` is reported
        if module in MOVED:
            lines.append(f"imports {module}: now {MOVED[module]}")
        elif any(part.startswith("test_") or part == "conftest" for part in parts):
            lines.append(f"imports {module}: move what it uses to tests/helpers/, import that")
        elif not module.startswith("tests.helpers") and not _exists(parts):
            lines.append(f"imports {module}: a support module; it goes to tests/helpers/")
    starters = [call[:-1] for call in PROCESS_STARTERS if call in text]
    if starters and (suite not in FOLDER_MARKERS) and "pytest.mark.slow" not in text:
        lines.append(
            f"starts agent processes ({', '.join(starters)}): `pytestmark = pytest.mark.slow`"
        )
    if "hypothesis" in text and "pytest.mark.fuzz" not in text:
        lines.append("uses hypothesis: @pytest.mark.fuzz if it runs long")
    if "chromium" in text.lower() and "BROWSER_MARKS" not in text:
        lines.append("drives chromium: `pytestmark = BROWSER_MARKS` (tests.helpers.chromium)")
    if "pg_dsn" in text or "postgres_cluster" in text:
        lines.append("uses PostgreSQL: marked postgres by its fixture, nothing to add")
    if "started(" in text and "make_agent" not in text:
        lines.append("starts its own agent: `await make_agent(grants=..., https=..., ...)`")
    if "__file__" in text and "parents[" in text:
        lines.append("finds files by Path(__file__).parents[N]: recount N in its new folder")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        target = Path(arg)
        if target.is_dir():
            for path in sorted(target.rglob("*.py")):
                if path.name.startswith("test_"):
                    print(f"{path}:\n  " + "\n  ".join(proposal(path)))
                elif path.name not in ("__init__.py", "conftest.py"):
                    print(f"{path}:\n  holds no tests: goes to tests/helpers/")
        elif target.name.startswith("test_"):
            print(f"{target}:\n  " + "\n  ".join(proposal(target)))
        else:
            module = ".".join(target.resolve().relative_to(REPO).with_suffix("").parts)
            folder = package_folder(module)
            where = test_folder_of(folder) if folder else "tests"
            print(f"{target}: its tests go to {where}/test_{target.stem}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
