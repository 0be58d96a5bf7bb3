"""CONTRIBUTING.md's layout table is ``LAYERS`` of ``tests/unit/layer_order.py``, in words.

One row per layer, bottom to top: every path a row names exists and belongs to that row's
layer, every folder ``LAYERS`` names appears in its row, and the "Uses" column names only
lower layers. A new layer, a moved folder or a reordered layer fails here until the table
says so too.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.layer_order import LAYERS, layer_of

ROOT = Path(__file__).resolve().parents[2]
_CODE = re.compile(r"`([^`]+)`")


def layout_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(paths of the first column, dotted names of the "Uses" column) of each table row."""
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or set(cells[0]) <= set("- "):
            continue
        if cells[0] == "Layer":
            continue
        rows.append((_CODE.findall(cells[0]), _CODE.findall(cells[2])))
    return rows


def module_of(path: str) -> str:
    """``gateway/audit/`` -> ``gateway.audit``; ``gateway/runtime/__init__.py`` -> ``gateway.runtime``."""
    name = path.rstrip("/").removesuffix(".py").removesuffix("/__init__")
    return name.replace("/", ".")


def test_one_row_per_layer_in_order() -> None:
    rows = layout_rows((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    assert len(rows) == len(LAYERS)
    misplaced = [
        (index, path, layer_of(module_of(path)))
        for index, (paths, _) in enumerate(rows)
        for path in paths
        if layer_of(module_of(path)) != index
    ]
    assert misplaced == []


def test_every_path_exists_and_every_folder_is_named() -> None:
    rows = layout_rows((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    named = {module_of(path) for paths, _ in rows for path in paths}
    missing = [path for paths, _ in rows for path in paths if not (ROOT / path).exists()]
    unnamed = [
        entry
        for layer in LAYERS
        for entry in layer
        if (ROOT / entry.replace(".", "/")).is_dir() and entry not in named
    ]
    assert missing == []
    assert unnamed == []


def test_uses_names_only_lower_layers() -> None:
    rows = layout_rows((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    upward = []
    for index, (_, uses) in enumerate(rows):
        for name in uses:
            layer = layer_of(name)
            if layer is None or layer >= index:
                upward.append((index, name, layer))
    assert upward == []


def test_the_table_is_read_as_written(tmp_path: Path) -> None:
    text = (
        "## Layout\n\n| Layer | Holds | Uses (from the rows above) |\n| --- | --- | --- |\n"
        "| `gateway/errors.py` | errors | nothing |\n| `capabilities/` | x | `gateway.errors` |\n"
        "\n## Next\n| `x/` | y | z |\n"
    )
    assert layout_rows(text) == [
        (["gateway/errors.py"], []),
        (["capabilities/"], ["gateway.errors"]),
    ]
    assert module_of("gateway/runtime/__init__.py") == "gateway.runtime"
