"""What an agent is composed over, read from outside before :func:`compose` wires it.

Reading them is the I/O of composing: the certificate files (or the first
SVID of the Workload API), the policy file, the capability modules; the
telemetry exporters and the state stores are opened by their services
(:mod:`gateway.runtime.resources`), so a failed start closes them. A test
builds :class:`Inputs` from whatever it needs (``Telemetry.off()``, a
registry of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from gateway.config import AgentConfig, WorkloadApiTls
from gateway.errors import AgentConfigError
from gateway.local.private_files import private_dir
from gateway.storage import Stores
from gateway.telemetry import Telemetry
from gateway.transport.live_tls import LiveTls
from gateway.transport.workload_api import WorkloadApiFeed
from policies.store import PolicyStore


@dataclass(frozen=True, slots=True)
class Inputs:
    """The read and opened things :func:`~gateway.runtime.compose.compose` wires together."""

    live_tls: LiveTls
    """The own certificate, key and CA in force."""
    workload_api: WorkloadApiFeed | None
    """The Workload API that gave the first SVID (None with ``[tls]`` files)."""
    policies: PolicyStore
    """The policy, read from its file."""
    registry: CapabilityRegistry
    """The capabilities to serve (the upstream ones are added by compose)."""
    telemetry: Telemetry
    """Metrics and spans."""
    stores: Stores
    """The open state stores."""


def read_identity(config: AgentConfig) -> tuple[LiveTls, WorkloadApiFeed | None]:
    """The own certificate in force: from the ``[tls]`` files, or the Workload API's first
    SVID (waited for up to ``start_timeout``), with the feed that will bring the next ones.

    Raises:
        AgentConfigError: the certificate is unreadable, expired, not this agent's, or
            no SVID came in time.
    """
    feed = (
        WorkloadApiFeed(config.id, config.tls) if isinstance(config.tls, WorkloadApiTls) else None
    )
    return LiveTls(config.id, config.tls, feed.first if feed else None), feed


def load_capabilities(config: AgentConfig, given: CapabilityRegistry | None) -> CapabilityRegistry:
    """``given``, else the registry of ``config.modules``; the state folder is made first
    (0700, if missing): modules keep their files there.

    Raises:
        AgentConfigError: a module cannot be loaded or registers a clashing capability.
        OSError: the state folder cannot be made.
    """
    private_dir(config.state_dir)
    if given is not None:
        return given
    registry = CapabilityRegistry()
    try:
        load_capability_modules(
            config.modules,
            registry,
            AgentEnvironment(config.id, config.state_dir),
            config.module_dir,
        )
    except CapabilityModuleError as err:
        raise AgentConfigError(str(err)) from err
    return registry
