"""Fronting MCP servers (``[[mcp_upstreams]]``): a local stdio program or Streamable HTTP.

``upstream`` holds one server's connection, its tools as pinned at start
(``tool_pins``) and the calls to them; ``stdio_link`` and ``http_link`` are the
two bounded transports under the MCP SDK's client session.
"""

from gateway.client.mcp.tool_pins import PinnedTool
from gateway.client.mcp.upstream import McpServerFailed, McpUpstream

__all__ = ["McpServerFailed", "McpUpstream", "PinnedTool"]
