"""Built-in capabilities: ``text.echo``, ``text.search``, ``kv.put``, ``kv.get``."""

from __future__ import annotations

from capabilities.builtin.echo import echo
from capabilities.builtin.kv import KeyValueStore, make_kv_capabilities
from capabilities.builtin.search import search
from capabilities.loading import AgentEnvironment
from capabilities.registry import CapabilityRegistry


def register(registry: CapabilityRegistry, env: AgentEnvironment) -> None:
    """Register every built-in capability; the key-value store lives in ``env.state_dir``."""
    registry.register(echo)
    registry.register(search)
    store = KeyValueStore(env.state_dir / "kv.sqlite")
    for cap in make_kv_capabilities(store):
        registry.register(cap)
