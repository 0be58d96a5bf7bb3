"""Which per-call path runs: mypyc-compiled copies of a few modules, or the Python.

The modules in :data:`COMPILED_MODULES` are strictly typed code every call
runs (the audit record's checked fields, its canonical bytes and chain hash,
the pipeline's checks and policy steps, the call as the transport hands it
over, the handler that admits, runs and audits it, the capability runner and
the context it hands the capability, and the gRPC servicer around them).
``python scripts/build_hotpath.py`` compiles them with mypyc into
``gateway/_compiled/`` (not in git, not needed: a machine without a compiler
simply runs the Python). :func:`install`, called once by ``gateway/__init__``
before any of them is imported, puts a finder in front of ``sys.meta_path``
that loads the compiled copy under the module's own name, so every importer
gets the same module whichever path runs.

The compiled copy is used only when the build's manifest names the SHA-256 of
each module's current source: a source edited after the build runs as Python
(and :data:`ACTIVE` says so) rather than as stale machine code.
``A2AGW_PURE_PYTHON=1`` forces the Python. Both paths give the same bytes and
hashes (``tests/unit/test_hotpath.py`` runs both and compares).

Value classes a call builds (the call, its admission, context, result and
outcome) are written for this: a dataclass's generated ``__init__`` stays
interpreted even in a compiled module, and a frozen one sets every field
through ``object.__setattr__`` (~400 instructions a field). So they are
``@dataclass(slots=True, init=False)`` with a hand-written ``__init__`` that
compiles to plain stores, and ``Final`` fields in place of ``frozen=True``:
read-only to the type checker on both paths and, compiled, at run time too
(an assignment raises ``AttributeError``); ``unsafe_hash=True`` keeps them
hashable as frozen ones were.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

COMPILED_MODULES = (
    "gateway.audit.chain",
    "gateway.audit.record",
    "gateway.inbound.pipeline",
    "gateway.inbound.invoke_handler",
    "gateway.inbound.call",
    "policies.decisions",
    "capabilities.runner",
    "capabilities.context",
    "gateway.server.grpc_server",
)
"""The modules the build compiles (each strictly typed, run by every call)."""
PURE_PYTHON_ENV = "A2AGW_PURE_PYTHON"
"""Set to ``1`` to run the Python modules even where a compiled build is present."""
COMPILED_DIR = Path(__file__).parent / "_compiled"
"""Where ``scripts/build_hotpath.py`` puts the build (extension modules and manifest)."""
MANIFEST = "manifest.json"
"""In ``COMPILED_DIR``: ``{"sources": {module: sha256 of its .py}, "support": [names]}``."""

_PACKAGE_ROOT = Path(__file__).parent.parent


def source_digest(module: str) -> str:
    """SHA-256 of a compiled module's Python source, as the manifest records it."""
    path = _PACKAGE_ROOT.joinpath(*module.split(".")).with_suffix(".py")
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled copy of each module it was given (and mypyc's support module)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self._files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        file = self._files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _extension(base: Path) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = base.with_name(base.name + suffix)
        if candidate.is_file():
            return candidate
    return None


def _compiled_files() -> tuple[dict[str, Path], str]:
    """The extension file of every module to load compiled, and why not if none."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return {}, f"pure Python ({PURE_PYTHON_ENV}=1)"
    try:
        manifest = json.loads((COMPILED_DIR / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}, "pure Python (no compiled build: python scripts/build_hotpath.py)"
    files: dict[str, Path] = {}
    for module in COMPILED_MODULES:
        file = _extension(COMPILED_DIR.joinpath(*module.split(".")))
        if file is None or manifest.get("sources", {}).get(module) != source_digest(module):
            return {}, f"pure Python (compiled build is stale or incomplete: {module})"
        files[module] = file
    for support in manifest.get("support", []):
        file = _extension(COMPILED_DIR / support)
        if file is None:
            return {}, f"pure Python (compiled build is incomplete: {support})"
        files[support] = file
    return files, "compiled (mypyc): " + ", ".join(COMPILED_MODULES)


ACTIVE = "pure Python (not chosen yet)"
"""What runs, in words: ``compiled (mypyc): ...`` or ``pure Python (why)``."""
_chosen = False


def install() -> str:
    """Choose the path once (before any compiled module is imported); returns ``ACTIVE``."""
    global ACTIVE, _chosen
    if _chosen or any(module in sys.modules for module in COMPILED_MODULES):
        return ACTIVE  # chosen already; a module is never swapped once imported
    _chosen = True
    files, ACTIVE = _compiled_files()
    if files:
        sys.meta_path.insert(0, _CompiledFinder(files))
    return ACTIVE


def is_compiled() -> bool:
    """True when the compiled modules are the ones imported."""
    return ACTIVE.startswith("compiled")
