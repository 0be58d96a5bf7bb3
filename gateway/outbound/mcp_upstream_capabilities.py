"""An MCP server's listed tools, as ordinary local capabilities.

Each ``[[mcp_upstreams.tools]]`` entry becomes a ``Capability`` in the agent's
registry once its server has listed it at start, so grants, payload caps,
limits, idempotency, the A2A card, plans and the audit log treat it like any
other: the decision path has admitted and validated the input (against the
schema the server listed, pinned) before the handler below runs, and the
capability runner checks the output against the pinned output contract and
digests it.

Only the fields the input schema declares leave this agent (the validated
model holds nothing else, and an optional field the caller left out stays
out). The output is the tool's ``structuredContent`` when it declared an
``outputSchema``, else ``{"text": ...}``, its text blocks joined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from capabilities.context import CallContext
from capabilities.contract import CapabilityContract
from capabilities.registry import Capability, CapabilityRegistry, DuplicateCapability, Handler
from capabilities.versions import Version
from gateway.client.mcp import McpUpstream, PinnedTool
from gateway.errors import AgentConfigError


def mcp_capability(tool: PinnedTool, upstream: McpUpstream) -> Capability:
    """The capability serving ``tool`` through ``upstream``."""
    config = tool.config
    contract = CapabilityContract(
        name=config.capability,
        version=Version.parse(config.version),
        risk=config.risk,
        timeout_seconds=config.timeout,
        idempotent=config.idempotent,
        input_model=tool.input_model,
        output_model=tool.output_model,
        description=tool.description or f"MCP tool {config.tool!r} of {upstream.name}",
    )
    return Capability(contract, _handler(tool, upstream), upstream=upstream.name)


def register_mcp_upstreams(registry: CapabilityRegistry, upstreams: Sequence[McpUpstream]) -> None:
    """Register each started upstream's pinned tools; AgentConfigError (naming it) on a clash."""
    for upstream in upstreams:
        for tool in upstream.tools.values():
            try:
                registry.register(mcp_capability(tool, upstream))
            except DuplicateCapability as err:
                raise AgentConfigError(
                    f"mcp_upstreams {upstream.entry.name!r} tool {tool.config.tool!r}: {err}"
                ) from err


def _handler(tool: PinnedTool, upstream: McpUpstream) -> Handler:
    async def call_tool(payload: BaseModel, ctx: CallContext) -> Any:
        arguments = payload.model_dump(mode="json")
        budget = min(tool.config.timeout, ctx.time_remaining())
        return await upstream.call(tool, arguments, budget, ctx.events)

    return call_tool
