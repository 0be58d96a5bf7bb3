"""Capabilities: typed contracts, the versioned registry, and built-ins."""

from capabilities.context import CallContext
from capabilities.contract import Accepts, CapabilityContract, ContractModel, Example, Gives, Risk
from capabilities.loading import AgentEnvironment, load_capability_modules
from capabilities.parts import (
    Answer,
    AnyObject,
    Artifact,
    DataPart,
    FilePart,
    MessageReply,
    Part,
    TaskReply,
    TextPart,
    UrlPart,
)
from capabilities.registry import Capability, CapabilityRegistry, DuplicateCapability, capability
from capabilities.versions import Version, VersionConstraint, VersionSyntaxError

__all__ = [
    "Accepts",
    "AgentEnvironment",
    "Answer",
    "AnyObject",
    "Artifact",
    "CallContext",
    "Capability",
    "CapabilityContract",
    "CapabilityRegistry",
    "ContractModel",
    "DataPart",
    "DuplicateCapability",
    "Example",
    "FilePart",
    "Gives",
    "MessageReply",
    "Part",
    "Risk",
    "TaskReply",
    "TextPart",
    "UrlPart",
    "Version",
    "VersionConstraint",
    "VersionSyntaxError",
    "capability",
    "load_capability_modules",
]
