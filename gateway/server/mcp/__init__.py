"""MCP over Streamable HTTP: this agent's capabilities as tools, behind the same door.

``tools/list`` shows a caller the capabilities its grant allows; ``tools/call``
takes the decision path every other door takes (identity, policy, limits,
payload cap, replay, validation, audit). See ``edge`` for what is decided
before anything of a request is parsed, and ``sdk_server`` for what the MCP
SDK answers itself.
"""

from gateway.server.mcp.edge import MCP_PATH, McpEdge
from gateway.server.mcp.sdk_server import SdkMcpServer
from gateway.server.mcp.server import McpHttpsServer

__all__ = ["MCP_PATH", "McpEdge", "McpHttpsServer", "SdkMcpServer"]
