"""The layers of the package, bottom to top, and a checker that every import points down.

A module belongs to the layer of the longest entry that names it or a package
above it (``gateway.audit.record`` is in the records layer, the rest of
``gateway.audit`` in the audit layer). A module may import its own layer and
the layers below; an import of a higher layer is a violation. Every import is
read from the source with :mod:`ast`, including imports inside functions and
under ``if TYPE_CHECKING:`` (a type-only import is still a dependency a reader
has to follow).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves: the package itself (lazy re-exports), the error tree, display escaping
    ("gateway", "gateway.errors", "gateway.display"),
    # helpers with no gateway state of their own
    (
        "gateway.local",
        "gateway.config.addresses",
        "gateway.runtime.instance_lock",
        "gateway.runtime.stopping",
        "gateway.wire",
        "gateway.postgres.dsn",
        "gateway.sql",
    ),
    ("capabilities",),
    ("policies",),
    ("gateway.config",),
    # what the serving and the calling side share: TLS, SVIDs, the status table
    ("gateway.transport",),
    # bearer identities: token verification, callers and users, token exchange
    ("gateway.identity",),
    # serving HTTP with uvicorn: listeners, bounded connections, the Host check
    ("gateway.http",),
    # the audit record and chain layout, which the PostgreSQL migrations also build on
    ("gateway.audit.record", "gateway.audit.chain", "gateway.audit.store.sqlite_schema"),
    ("gateway.postgres",),
    ("gateway.audit",),
    ("gateway.telemetry",),
    # the calling side: PeerClient, the handshake, the A2A upstream client
    ("gateway.client",),
    # A2A push notifications: webhook configs, the outbox, guarded and signed deliveries
    ("gateway.push",),
    ("gateway.inbound",),
    ("gateway.outbound",),
    ("gateway.plans",),
    # the serving edge: peer gRPC servicer, health, the A2A bindings
    ("gateway.server",),
    ("gateway.admin",),
    # the one place that picks every store's backend
    ("gateway.storage",),
    ("gateway.console",),
    ("gateway.runtime", "gateway.runtime.agent"),
    ("gateway.runtime.supervisor",),
    ("gateway.devtools",),
    ("gateway.cli",),
)
"""Bottom to top. Only packages of ours appear; third-party imports are not checked."""

ROOT_PACKAGES = ("gateway", "policies", "capabilities")


@dataclass(frozen=True, slots=True)
class Violation:
    """One import of a higher layer."""

    path: str
    line: int
    importer: str
    imported: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.importer} (layer {layer_name(self.importer)}) "
            f"imports {self.imported} (layer {layer_name(self.imported)}, higher)"
        )


def _entry_of(module: str) -> str | None:
    best: str | None = None
    for layer in LAYERS:
        for entry in layer:
            exact_only = entry == "gateway"  # the package __init__, not everything in it
            named = module == entry or (not exact_only and module.startswith(entry + "."))
            if named and (best is None or len(entry) > len(best)):
                best = entry
    return best


def layer_of(module: str) -> int | None:
    """The index of ``module``'s layer in :data:`LAYERS`, or None if no layer names it."""
    entry = _entry_of(module)
    if entry is None:
        return None
    return next(index for index, layer in enumerate(LAYERS) if entry in layer)


def layer_name(module: str) -> str:
    """The entry that places ``module`` (for messages)."""
    return _entry_of(module) or "?"


def module_name(root: Path, path: Path) -> str:
    """``gateway/audit/__init__.py`` -> ``gateway.audit``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, *, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module of ours that ``source`` imports, with the line, at any depth."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # ``from gateway.plans import executor`` names a module
                yield f"{target}.{alias.name}", node.lineno


def violations(
    sources: Mapping[str, tuple[str, str, bool]], known: Iterable[tuple[str, str]] = ()
) -> list[Violation]:
    """Upward imports in ``sources`` (module -> (path, text, is_package)).

    ``known`` lists (importer module, imported module) pairs that are tolerated.
    """
    allowed = set(known)
    found: list[Violation] = []
    for module, (path, text, is_package) in sorted(sources.items()):
        own = layer_of(module)
        if own is None:
            continue
        for imported, line in imports_of(text, module, is_package=is_package):
            if imported.split(".")[0] not in ROOT_PACKAGES:
                continue
            if imported not in sources and not any(m.startswith(imported + ".") for m in sources):
                continue  # ``from pkg import name``: a name, not a module
            theirs = layer_of(imported)
            if theirs is not None and theirs > own and (module, imported) not in allowed:
                found.append(Violation(path, line, module, imported))
    # ``from gateway.plans import executor`` is reported once, as the module it names
    named = {(v.path, v.line, v.imported) for v in found}
    return [
        v
        for v in found
        if not any(
            (v.path, v.line) == (path, line) and other.startswith(v.imported + ".")
            for path, line, other in named
        )
    ]


def package_sources(root: Path) -> dict[str, tuple[str, str, bool]]:
    """Every module of ours under ``root`` (generated wire code included: it is checked too)."""
    sources: dict[str, tuple[str, str, bool]] = {}
    for package in ROOT_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(root, path)
            sources[module] = (
                str(path.relative_to(root)),
                path.read_text(),
                path.name == "__init__.py",
            )
    return sources


def unplaced(sources: Iterable[str]) -> list[str]:
    """Modules no layer names (a new top-level package must be placed explicitly)."""
    return sorted(module for module in sources if layer_of(module) is None)
