"""scripts/where_test_goes.py proposes the folder that mirrors what a test module tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def where() -> ModuleType:
    spec = importlib.util.spec_from_file_location("where", REPO / "scripts/where_test_goes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_placed_module_is_proposed_where_it_is(where: ModuleType) -> None:
    path = REPO / "tests/server/mcp/test_mcp_serving.py"
    assert where.proposal(path)[0] == "goes to tests/server/mcp/test_mcp_serving.py"


def test_a_module_of_a_suite_stays_in_its_suite(where: ModuleType) -> None:
    assert where.proposal(REPO / "tests/faults/test_sigterm_writes.py")[0].startswith(
        "stays in tests/faults/"
    )


def test_a_source_module_names_its_test_module(
    where: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert where.main(["gateway/server/mcp/edge.py"]) == 0
    assert capsys.readouterr().out == (
        "gateway/server/mcp/edge.py: its tests go to tests/server/mcp/test_edge.py\n"
    )


def test_every_old_support_module_has_a_new_home(where: ModuleType) -> None:
    missing = [
        new for new in where.MOVED.values() if not (REPO / f"{new.replace('.', '/')}.py").is_file()
    ]
    assert missing == []
