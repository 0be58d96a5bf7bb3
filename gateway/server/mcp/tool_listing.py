"""A capability as an MCP tool, for ``tools/list``.

One tool per capability name: the highest version the caller's grant lets it
call, i.e. the version a ``tools/call`` without a version constraint is served
by. Its fields come from the contract:

* ``name``: the capability name (``text.echo``; MCP tool names allow dots);
* ``description``: the contract's description, as written;
* ``inputSchema`` and ``outputSchema``: the contract's JSON Schemas;
* ``annotations``: hints from the contract's risk and idempotence (a read is
  read-only and idempotent; a write may destroy; an external capability acts on
  the world beyond this agent);
* ``_meta``: ``a2agw/version`` (the version served) and ``a2agw/risk``.

A tool's ``arguments`` are one JSON object, i.e. one A2A data part: a
capability whose served version takes no data part (``Accepts(data=False)``:
text or files only) is no tool and is not listed (a ``tools/call`` naming it is
refused ``CONTENT_TYPE_NOT_SUPPORTED``). ``outputSchema`` is declared only for
a capability whose answer is its output object (its ``gives`` names data parts
and tasks, nothing else): one that may answer with text, files, URLs or a
Message answers in content blocks instead (``tool_results``).

A tool's form depends only on its capability, so it is built once per
capability and kept.
"""

from __future__ import annotations

from typing import Any

from capabilities.contract import CapabilityContract, Risk
from capabilities.parts import AnyObject
from capabilities.registry import Capability

VERSION_META = "a2agw/version"
"""Tool ``_meta`` key of the capability version a call is served by."""
RISK_META = "a2agw/risk"
"""Tool ``_meta`` key of the capability's risk (``read``, ``write``, ``external``)."""


def tools_of(visible: list[Capability], cache: dict[str, dict[str, Any]]) -> list[Any]:
    """The tools for ``visible`` (ascending by name and version): one per name, its highest.

    ``cache`` keeps each tool by ``name@version`` (unique in a registry).
    """
    highest: dict[str, Capability] = {}
    for cap in visible:
        highest[cap.name] = cap  # ascending order: the last one of a name is its highest
    tools = []
    for cap in highest.values():
        if not cap.contract.accepts.data:  # the version a call is served by takes no object
            continue
        tool = cache.get(cap.contract.key)
        if tool is None:
            tool = cache[cap.contract.key] = tool_of(cap)
        tools.append(tool)
    return tools


def tool_of(cap: Capability) -> dict[str, Any]:
    """The MCP ``Tool`` object (JSON form) of ``cap``."""
    contract = cap.contract
    tool: dict[str, Any] = {
        "name": contract.name,
        "inputSchema": contract.input_schema(),
        "annotations": tool_annotations(contract.risk, idempotent=contract.idempotent),
        "_meta": {VERSION_META: str(contract.version), RISK_META: contract.risk.value},
    }
    if answers_objects(contract):
        tool["outputSchema"] = contract.output_schema()
    if contract.description:
        tool["description"] = contract.description
    return tool


def answers_objects(contract: CapabilityContract) -> bool:
    """True if ``contract``'s answer is its output object (``structuredContent``), so its
    output schema is the tool's: it gives data parts in tasks, no other part, no Message."""
    gives = contract.gives
    plain = gives.data and gives.tasks and not (gives.text or gives.files or gives.urls)
    return plain and not gives.messages and contract.output_model is not AnyObject


def tool_annotations(risk: Risk, *, idempotent: bool) -> dict[str, bool]:
    """MCP tool annotations for a capability of ``risk``.

    The hints say what the contract says, never less: a write is marked
    possibly destructive, as MCP's own default for a tool that is not read-only.
    """
    read = risk is Risk.READ
    return {
        "readOnlyHint": read,
        "destructiveHint": not read,
        "idempotentHint": read or idempotent,
        "openWorldHint": risk is Risk.EXTERNAL,
    }
