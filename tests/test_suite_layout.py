"""The test suite's own rules: where modules go, what they import, how they are marked.

Each failure names the file and says the fix, so a test that lands from another branch
is placed in a minute (``python scripts/where_test_goes.py PATH`` proposes the place).
Test modules import only helpers (tests/helpers/), never another test module or a
conftest; support modules live in tests/helpers/; folders mirror the package; a test
that starts agent processes is in the rest tier; and a bare ``pytest`` (the fast tier)
plus ``--tier=rest`` run every collected test exactly once.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiers import (
    FOLDER_MARKERS,
    PACKAGE_ROOTS,
    PROCESS_STARTERS,
    REVIEW_WORDS,
    SUITES,
    TIER_MARKERS,
)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PLACE = "`python scripts/where_test_goes.py {path}` says where"
"""The pointer every placement message ends with."""


def _python_files() -> list[Path]:
    return sorted(
        path
        for path in TESTS.rglob("*.py")
        if "node_modules" not in path.parts and "__pycache__" not in path.parts
    )


def _test_modules() -> list[Path]:
    return [path for path in _python_files() if path.name.startswith("test_")]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def _is_test_or_conftest(module: str) -> bool:
    return module.startswith("tests.") and any(
        part.startswith("test_") or part == "conftest" for part in module.split(".")
    )


def _first_per_line(imports: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Per line, the first module that is a test module or conftest (``from a import b``
    names ``a`` and ``a.b``; one message is enough)."""
    seen: set[int] = set()
    kept = []
    for line, module in imports:
        if _is_test_or_conftest(module) and line not in seen:
            seen.add(line)
            kept.append((line, module))
    return kept


def _failures(title: str, offences: list[str]) -> str:
    return f"{title} ({len(offences)}):\n  " + "\n  ".join(offences)


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    offences = [
        f"{_rel(path)}:{line} imports {module}: move what both use to tests/helpers/ "
        "(a module named after what it holds) and import it from there"
        for path in _python_files()
        for line, module in _first_per_line(_imported_modules(path))
        if _is_test_or_conftest(module)
    ]
    assert offences == [], _failures("a test module or conftest imported", offences)


def _helper_name(path: Path) -> str:
    stem = re.sub(r"_(support|utils|helpers?)$", "", path.stem)
    return f"tests/helpers/{stem}.py"


def _misplaced_support(path: Path) -> bool:
    """Not a test, conftest or package marker, and outside tests/helpers/ (and outside the
    other languages' projects in tests/interop/, whose files are theirs)."""
    if path.name.startswith("test_") or path.name in ("conftest.py", "__init__.py"):
        return False
    parts = path.relative_to(TESTS).parts
    return parts[0] != "helpers" and not (parts[0] == "interop" and len(parts) > 2)


def test_support_modules_live_in_helpers() -> None:
    offences = [
        f"{_rel(path)} holds no tests: move it to {_helper_name(path)} and import it as "
        f"{_helper_name(path)[:-3].replace('/', '.')}"
        for path in _python_files()
        if _misplaced_support(path)
    ]
    assert offences == [], _failures("support modules outside tests/helpers/", offences)


def test_helpers_hold_no_tests() -> None:
    offences = [
        f"{_rel(path)} is a test module in tests/helpers/: move it to the folder that "
        f"mirrors what it tests ({PLACE.format(path=_rel(path))})"
        for path in (TESTS / "helpers").rglob("test_*.py")
    ]
    assert offences == [], _failures("tests in tests/helpers/", offences)


def test_every_folder_of_python_tests_is_a_package() -> None:
    offences = [
        f"{_rel(folder)}/ has no __init__.py: add an empty one (its modules are imported "
        f"as {'.'.join(folder.relative_to(REPO).parts)}.*)"
        for folder in sorted({path.parent for path in _python_files()})
        if not (folder / "__init__.py").exists()
    ]
    assert offences == [], _failures("test folders that are not packages", offences)


def _mirrors_something(parts: tuple[str, ...]) -> bool:
    if parts[0] in SUITES:
        return True
    if parts[0] in PACKAGE_ROOTS[1:]:
        return (REPO.joinpath(*parts)).is_dir()
    return (REPO / PACKAGE_ROOTS[0]).joinpath(*parts).is_dir()


def test_folders_mirror_the_package() -> None:
    offences = [
        f"tests/{'/'.join(parts)}/ mirrors no package folder: move "
        f"{', '.join(sorted(p.name for p in folder.glob('test_*.py'))) or 'its modules'} to the "
        f"folder of the package each tests ({PLACE.format(path=_rel(folder))})"
        for folder in sorted({path.parent for path in _test_modules()})
        if (parts := folder.relative_to(TESTS).parts) and not _mirrors_something(parts)
    ]
    assert offences == [], _failures(
        f"test folders that mirror neither gateway/ nor a suite ({', '.join(SUITES)})",
        offences,
    )


def test_test_modules_are_named_after_what_they_test() -> None:
    offences = [
        f"{_rel(path)} is named after a review ({word!r}): name it after the module or "
        "behaviour it tests (tests/inbound/limits/test_limit_table.py, test_sigterm_writes.py)"
        for path in _test_modules()
        for word in REVIEW_WORDS
        if word in path.stem.split("_")
    ]
    assert offences == [], _failures("test modules named after a review", offences)


def _dotted_module_exists(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _moved_to(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    helpers = sorted(
        path.stem
        for path in (TESTS / "helpers").glob("*.py")
        if path.stem == last or last.endswith(path.stem) or path.stem.endswith(last)
    )
    if helpers:
        return " or ".join(f"tests.helpers.{stem}" for stem in helpers) + "?"
    return "support modules and programs the tests run are in tests/helpers/"


def test_module_names_in_strings_name_modules_that_exist() -> None:
    offences = [
        f"{_rel(path)}:{node.lineno} names {node.value!r}, which is no module: "
        f"{_moved_to(node.value)}"
        for path in _python_files()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"tests(\.\w+)+", node.value)
        and not _dotted_module_exists(node.value)
    ]
    assert offences == [], _failures("module names that name nothing", offences)


def test_tests_that_start_agent_processes_are_in_the_rest_tier() -> None:
    marks = tuple(f"pytest.mark.{name}" for name in TIER_MARKERS)
    offences = [
        f"{_rel(path)} starts agent processes ({', '.join(found)}) and marks nothing: "
        "add `pytestmark = pytest.mark.slow` after its imports (or @pytest.mark.slow on "
        "the tests that start them)"
        for path in _test_modules()
        if path.relative_to(TESTS).parts[0] not in FOLDER_MARKERS
        and (found := [call[:-1] for call in PROCESS_STARTERS if call in path.read_text()])
        and not any(mark in path.read_text() for mark in marks)
    ]
    assert offences == [], _failures("agent processes in the fast tier", offences)


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
    assert sorted(fast & rest) == [], "in both tiers"
    assert sorted(full - (fast | rest)) == [], "in neither tier"
    assert len(fast) > len(rest) > 0
