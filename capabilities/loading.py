"""Loading the Python modules that register an agent's capabilities."""

from __future__ import annotations

import importlib
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
    modules: Sequence[str], registry: CapabilityRegistry, env: AgentEnvironment
) -> None:
    """Import each module and let it register its capabilities.

    A module either defines ``register(registry, env)`` or exposes module-level
    ``Capability`` objects (made with ``@capability``), which are registered.
    """
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            raise CapabilityModuleError(
                f"capability module {name!r} cannot be imported: {err}"
            ) from err
        register = getattr(module, "register", None)
        if callable(register):
            register(registry, env)
            continue
        found = [value for value in vars(module).values() if isinstance(value, Capability)]
        if not found:
            raise CapabilityModuleError(
                f"capability module {name!r} has no register() and no @capability functions"
            )
        for cap in found:
            registry.register(cap)
