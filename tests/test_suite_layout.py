"""The test suite's own rules: where modules go, what they import, and that the tiers cover it.

Test modules import only helpers (tests/helpers/), never another test module or a conftest;
support modules live in tests/helpers/; and a bare ``pytest`` (the fast tier) plus
``--tier=rest`` run every collected test exactly once.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _python_files() -> list[Path]:
    return [
        path
        for path in TESTS.rglob("*.py")
        if "node_modules" not in path.parts and "__pycache__" not in path.parts
    ]


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    offences = [
        f"{path.relative_to(REPO)}:{line}: imports {module}"
        for path in _python_files()
        for line, module in _imported_modules(path)
        if module.startswith("tests.")
        and any(part.startswith("test_") or part == "conftest" for part in module.split("."))
    ]
    assert offences == [], "move what is shared into tests/helpers/:\n" + "\n".join(offences)


def test_support_modules_live_in_helpers() -> None:
    outside = sorted(
        str(path.relative_to(REPO))
        for path in _python_files()
        if not path.name.startswith("test_")
        and path.name not in ("conftest.py", "__init__.py")
        and "helpers" not in path.relative_to(TESTS).parts
        and "interop" not in path.relative_to(TESTS).parts[:1]  # other languages' projects
    )
    assert outside == []


def test_helpers_hold_no_tests() -> None:
    assert sorted(path.name for path in (TESTS / "helpers").rglob("test_*.py")) == []


def test_every_folder_of_python_tests_is_a_package() -> None:
    folders = {path.parent for path in _python_files()}
    assert (
        sorted(
            str(folder.relative_to(REPO))
            for folder in folders
            if not (folder / "__init__.py").exists()
        )
        == []
    )


def _collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_the_fast_and_the_rest_tier_run_every_test_exactly_once() -> None:
    fast, rest, full = _collected(), _collected("--tier=rest"), _collected("--tier=full")
    assert fast & rest == set()
    assert fast | rest == full
    assert len(fast) > len(rest) > 0
