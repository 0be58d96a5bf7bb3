"""The tools an MCP server lists when the agent starts, pinned as contracts until it restarts.

For each tool ``[[mcp_upstreams.tools]]`` names, the server's ``tools/list``
entry gives:

* the input contract, from ``inputSchema``: only the fields it declares leave
  this agent, each checked strictly (``capabilities.schema_models``);
* the output contract, from ``outputSchema`` when the tool declares one (its
  ``structuredContent`` is then the output); otherwise ``{"text": string}``,
  the answer's text blocks joined;
* a description (unless the operator wrote one): the server's own text,
  escaped and cut to 2,000 characters. It is data shown to callers, never
  read as an instruction by this agent.

The schemas must be within the subset ``capabilities.schema_models``
understands; keywords that only annotate (``default``, ``examples``,
``$schema``, ``$comment``, ``deprecated``, ``readOnly``, ``writeOnly``,
``format``) are dropped first, since they constrain nothing. A tool the server
does not list, or whose schema is outside the subset, stops the agent's start
with the upstream, tool and problem named: a capability is never served under
a contract narrower or wider than the one its server declared.

Whatever the server lists later (``notifications/tools/list_changed``, a
restarted server listing other schemas) changes nothing here: inputs and
outputs are checked against these pins until the agent restarts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import Field

from capabilities.contract import ContractModel
from capabilities.schema_models import SchemaNotSupported, contract_model
from gateway.config import McpUpstreamEntry, McpUpstreamTool
from gateway.display import printable
from gateway.errors import AgentConfigError

MAX_DESCRIPTION = 2000
ANNOTATIONS = frozenset(
    {"default", "examples", "$schema", "$comment", "deprecated", "readOnly", "writeOnly", "format"}
)
"""Schema keywords that only annotate: dropped before the schema becomes a contract."""


class TextOutput(ContractModel):
    """The output of a tool without ``outputSchema``: its answer's text blocks, joined."""

    text: str = Field(max_length=64 * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class PinnedTool:
    """One tool as the server listed it at start, and as it is served here.

    Attributes:
        config: The operator's entry (capability name, version, risk, timeout).
        description: What callers are told it does.
        input_model: Its pinned input contract.
        output_model: Its pinned output contract.
        structured: It declared ``outputSchema``: its ``structuredContent`` is the output.
    """

    config: McpUpstreamTool
    description: str
    input_model: type[ContractModel]
    output_model: type[ContractModel]
    structured: bool


def pin_tools(entry: McpUpstreamEntry, listed: Sequence[types.Tool]) -> dict[str, PinnedTool]:
    """The configured tools of ``entry`` as ``listed`` declares them, by tool name.

    Raises:
        AgentConfigError: a configured tool is not listed, or its schema cannot be pinned.
    """
    by_name = {tool.name: tool for tool in listed}
    pinned: dict[str, PinnedTool] = {}
    for number, wanted in enumerate(entry.tools):
        where = f"mcp_upstreams {entry.name!r} tools[{number}] ({wanted.tool!r})"
        tool = by_name.get(wanted.tool)
        if tool is None:
            raise AgentConfigError(f"{where}: the MCP server lists no such tool")
        name = "".join(part.capitalize() for part in wanted.capability.replace("-", "_").split("."))
        try:
            input_model = contract_model(f"{name}Input", without_annotations(tool.input_schema))
            output_model: type[ContractModel] = TextOutput
            if tool.output_schema is not None:
                output_model = contract_model(
                    f"{name}Output", without_annotations(tool.output_schema)
                )
        except SchemaNotSupported as err:
            raise AgentConfigError(f"{where}: its schema is not supported: {err}") from err
        pinned[wanted.tool] = PinnedTool(
            config=wanted,
            description=wanted.description or _shown(tool.description or ""),
            input_model=input_model,
            output_model=output_model,
            structured=tool.output_schema is not None,
        )
    return pinned


def without_annotations(schema: Any) -> Any:
    """``schema`` without the keywords that only annotate, in it and in the schemas of its
    ``properties`` and ``items`` (a copy; a property named ``format`` stays a property)."""
    if not isinstance(schema, dict):
        return schema
    kept = {key: value for key, value in schema.items() if key not in ANNOTATIONS}
    properties = kept.get("properties")
    if isinstance(properties, dict):
        kept["properties"] = {key: without_annotations(sub) for key, sub in properties.items()}
    if "items" in kept:
        kept["items"] = without_annotations(kept["items"])
    return kept


def _shown(description: str) -> str:
    """The server's description as callers see it: escaped (one line, no control or bidi
    characters), cut to :data:`MAX_DESCRIPTION` characters."""
    return printable(description)[:MAX_DESCRIPTION]
