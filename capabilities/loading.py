"""Loading the Python modules that register an agent's capabilities."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capabilities.registry import Capability, CapabilityRegistry


@dataclass(frozen=True, slots=True)
class AgentEnvironment:
    """What a capability module may use when it registers.

    Attributes:
        agent_id: SPIFFE ID of the agent hosting the capabilities.
        state_dir: Directory for the module's durable state (created by the agent).
    """

    agent_id: str
    state_dir: Path


class CapabilityModuleError(ImportError):
    """A configured capability module could not be imported or registered."""


def load_capability_modules(
    modules: Sequence[str],
    registry: CapabilityRegistry,
    env: AgentEnvironment,
    search_dir: Path | None = None,
) -> None:
    """Import each module and let it register its capabilities.

    A module either defines ``register(registry, env)`` or exposes module-level
    ``Capability`` objects (made with ``@capability``), which are registered.

    Args:
        modules: Dotted module names.
        registry: Where the capabilities go.
        env: What the modules may use when they register.
        search_dir: A folder modules are also imported from (the agent
            config's folder), after the normal import path: a module beside
            the config imports without ``PYTHONPATH``, and an installed
            package of the same name still wins.

    Raises:
        CapabilityModuleError: a module cannot be imported (whatever it raised,
            a syntax error too) or cannot register (a capability registered
            twice, a bad version or risk, a ``register()`` that raises).
    """
    if search_dir is not None and str(search_dir) not in sys.path:
        sys.path.append(str(search_dir))
        importlib.invalidate_caches()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # also a syntax error, or anything its top level raises
            why = str(err) if isinstance(err, ImportError) else f"{type(err).__name__}: {err}"
            raise CapabilityModuleError(
                f"capability module {name!r} cannot be imported: {why}"
            ) from err
        try:
            _register(module, name, registry, env)
        except CapabilityModuleError:
            raise
        except Exception as err:  # e.g. a capability registered twice, a register() that raises
            raise CapabilityModuleError(
                f"capability module {name!r} cannot register: {type(err).__name__}: {err}"
            ) from err


def _register(
    module: object, name: str, registry: CapabilityRegistry, env: AgentEnvironment
) -> None:
    register = getattr(module, "register", None)
    if callable(register):
        register(registry, env)
        return
    found = [value for value in vars(module).values() if isinstance(value, Capability)]
    if not found:
        raise CapabilityModuleError(
            f"capability module {name!r} has no register() and no @capability functions"
        )
    for cap in found:
        registry.register(cap)
