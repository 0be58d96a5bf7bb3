"""Capabilities: typed contracts, the versioned registry, and built-ins."""

from capabilities.context import CallContext
from capabilities.contract import CapabilityContract, ContractModel, Example, Risk
from capabilities.loading import AgentEnvironment, load_capability_modules
from capabilities.registry import Capability, CapabilityRegistry, DuplicateCapability, capability
from capabilities.versions import Version, VersionConstraint, VersionSyntaxError

__all__ = [
    "AgentEnvironment",
    "CallContext",
    "Capability",
    "CapabilityContract",
    "CapabilityRegistry",
    "ContractModel",
    "DuplicateCapability",
    "Example",
    "Risk",
    "Version",
    "VersionConstraint",
    "VersionSyntaxError",
    "capability",
    "load_capability_modules",
]
