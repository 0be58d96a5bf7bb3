"""A real MCP server built with the official MCP Python SDK, for the fronting tests.

Its low-level ``Server`` serves, over stdio (``python -m
tests.integration.mcp.sdk_tool_server``) or Streamable HTTP (:func:`http_app`):

* ``echo`` ``{"text"}``: text ``echo: TEXT``, no output schema;
* ``add`` ``{"a", "b", "note"?}``: ``{"sum", "keys"}`` as ``structuredContent``
  (``keys``: the argument names that reached it);
* ``steps`` ``{"n"}``: ``n`` progress notifications, then text ``done``;
* ``wait`` ``{"tag"}``: waits until cancelled, then leaves a file named after
  the tag in ``$MARKER_DIR`` (proof, to another process, that it saw the
  cancellation);
* ``fail`` ``{}``: a tool error whose text must never reach a caller or a log.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

SECRET_ERROR = "the server's own words: secret-in-error"
"""Text the ``fail`` tool answers with: never seen by callers or in logs."""

TOOLS = [
    types.Tool(
        name="echo",
        description="Echo a text.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string", "description": "What to echo."}},
            "required": ["text"],
        },
    ),
    types.Tool(
        name="add",
        description="Add two integers.",
        input_schema={
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "integer", "default": 0},
                "note": {"type": "string"},
            },
            "required": ["a"],
        },
        output_schema={
            "type": "object",
            "properties": {
                "sum": {"type": "integer"},
                "keys": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["sum", "keys"],
        },
    ),
    types.Tool(
        name="steps",
        description="Report progress n times.",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 20}},
            "required": ["n"],
        },
    ),
    types.Tool(
        name="wait",
        description="Wait until cancelled.",
        input_schema={
            "type": "object",
            "properties": {"tag": {"type": "string"}},
            "required": ["tag"],
        },
    ),
    types.Tool(name="fail", description="Fail.", input_schema={"type": "object"}),
]


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
    """Every tool above."""
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    """Run one tool (see the module)."""
    arguments = params.arguments or {}
    if params.name == "echo":
        return _text(f"echo: {arguments['text']}")
    if params.name == "add":
        output = {"sum": arguments["a"] + arguments.get("b", 0), "keys": sorted(arguments)}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(output))], structured_content=output
        )
    if params.name == "steps":
        for number in range(1, arguments["n"] + 1):
            await ctx.session.report_progress(number, arguments["n"], f"step {number}")
        return _text("done")
    if params.name == "wait":
        try:
            await anyio.sleep(600)
        except anyio.get_cancelled_exc_class():
            marker = Path(os.environ.get("MARKER_DIR", ".")) / arguments["tag"]
            marker.touch()
            raise
        return _text("waited")
    if params.name == "fail":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=SECRET_ERROR)], is_error=True
        )
    raise ValueError(f"unknown tool {params.name}")


def server() -> Server[Any]:
    """The SDK's low-level server of these tools."""
    return Server("sdk-tools", on_list_tools=list_tools, on_call_tool=call_tool)


def http_app() -> Any:
    """The server as the SDK's Streamable HTTP app (stateful sessions, its default)."""
    return server().streamable_http_app()


async def _serve_stdio() -> None:
    srv = server()
    async with stdio_server() as (read, write):
        await srv.run(read, write, srv.create_initialization_options())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--stderr-noise":
        print("noise on stderr: secret-in-stderr", file=sys.stderr, flush=True)
    asyncio.run(_serve_stdio())
