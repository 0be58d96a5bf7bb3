"""Agent configuration files (TOML), validated into frozen models: one module per table.

``agent`` holds the whole file (:class:`AgentConfig`, :func:`load_agent_config`) and its
example; each table has a module of its own (``tls``, ``a2a``, ``peers``, ...).
"""

from gateway.config.a2a import A2ASettings
from gateway.config.agent import AgentConfig, load_agent_config
from gateway.config.audit_checkpoints import AuditCheckpoints
from gateway.config.console import ConsoleSettings
from gateway.config.fields import Duration
from gateway.config.identity import IdentitySettings, TokenIssuer, TokenSettings
from gateway.config.mcp import McpSettings, McpUpstreamEntry, McpUpstreamTool
from gateway.config.metrics import MetricsSettings
from gateway.config.peers import PeerEntry
from gateway.config.plans import PlanSettings
from gateway.config.push import PushSettings
from gateway.config.tls import TlsFiles, TlsSettings, WorkloadApiTls, check_workload_api_socket
from gateway.config.tracing import TracingSettings
from gateway.config.upstreams import UpstreamEntry, UpstreamSkill

__all__ = [
    "A2ASettings",
    "AgentConfig",
    "AuditCheckpoints",
    "ConsoleSettings",
    "Duration",
    "IdentitySettings",
    "McpSettings",
    "McpUpstreamEntry",
    "McpUpstreamTool",
    "MetricsSettings",
    "PeerEntry",
    "PlanSettings",
    "PushSettings",
    "TlsFiles",
    "TlsSettings",
    "TokenIssuer",
    "TokenSettings",
    "TracingSettings",
    "UpstreamEntry",
    "UpstreamSkill",
    "WorkloadApiTls",
    "check_workload_api_socket",
    "load_agent_config",
]
