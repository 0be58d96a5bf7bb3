"""The audit package is given its stores; it never opens them (no audit <-> storage cycle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_by(package: Path) -> dict[str, set[str]]:
    """Every module each file under ``package`` imports (static, including lazy imports)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(ROOT))] = names
    return found


def _loaded_after(module: str) -> set[str]:
    code = f"import sys\nimport {module}\nprint('\\n'.join(sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(run.stdout.split())


def test_no_audit_module_imports_the_storage_factory() -> None:
    importers = {
        path
        for path, names in _imported_by(ROOT / "gateway" / "audit").items()
        if any(name == "gateway.storage" or name.startswith("gateway.storage.") for name in names)
    }
    assert importers == set()


def test_postgres_migrations_do_not_import_the_audit_package() -> None:
    importers = {
        path
        for path, names in _imported_by(ROOT / "gateway" / "postgres").items()
        if any(name == "gateway.audit" or name.startswith("gateway.audit.") for name in names)
    }
    assert importers == set()
    loaded = _loaded_after("gateway.postgres.migrations")
    assert "gateway.postgres.migrations" in loaded
    assert not {m for m in loaded if m == "gateway.audit" or m.startswith("gateway.audit.")}


def test_importing_the_audit_package_loads_no_storage_factory() -> None:
    loaded = _loaded_after("gateway.audit")
    assert "gateway.audit.log" in loaded
    assert not {m for m in loaded if m == "gateway.storage" or m.startswith("gateway.storage.")}
