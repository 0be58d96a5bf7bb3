"""The MCP SDK's own server, for every request the edge does not answer itself.

The edge answers ``tools/list``, ``tools/call`` and ``notifications/cancelled``.
Everything else MCP defines (``initialize``, ``ping``, ``server/discover``,
``notifications/initialized``, methods this agent does not serve, messages
that are not requests) is the SDK's: its low-level ``Server`` behind its
``StreamableHTTPSessionManager`` in stateless mode, answering in JSON. So the
handshake, version negotiation and the errors of both protocol eras are the
SDK's own, and no request depends on an earlier one: any worker or replica
can serve any request.

The ``tools`` handlers registered here make the SDK advertise the tools
capability in ``initialize`` and ``server/discover``; the edge answers those
methods before the SDK could, so they only say so if ever reached.
"""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Receive, Scope, Send

from gateway.server.mcp.tool_results import INTERNAL_ERROR

SERVER_NAME = "a2a-peer-gateway"


def _package_version() -> str:
    try:
        return version("a2a-peer-gateway")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


async def _answered_by_edge(_ctx: Any, _params: Any) -> Any:
    raise MCPError(code=INTERNAL_ERROR, message="this method is answered before the MCP SDK")


class SdkMcpServer:
    """The SDK's server and stateless session manager (see the module)."""

    def __init__(self, agent_id: str, max_body_bytes: int) -> None:
        """``max_body_bytes``: the largest body the SDK reads (the edge has bounded it)."""
        server: Server[Any] = Server(
            SERVER_NAME,
            version=_package_version(),
            title=agent_id,
            on_list_tools=_answered_by_edge,
            on_call_tool=_answered_by_edge,
        )
        # The SDK's OpenTelemetry middleware would add its own spans to the agent's.
        server.middleware = []
        self._manager = StreamableHTTPSessionManager(
            app=server,
            json_response=True,
            stateless=True,
            # The edge checks Host and Origin itself, before the SDK (which would
            # log the refused header values).
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=max_body_bytes,
        )
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Run the manager (its task group) in a task of its own, until :meth:`stop`.

        A task of its own: an anyio task group must be left by the task that
        entered it, and an agent may be stopped from another task than started it.
        """
        started = asyncio.Event()
        self._stopping = asyncio.Event()

        async def run() -> None:
            async with self._manager.run():
                started.set()
                await self._stopping.wait()

        self._task = asyncio.create_task(run(), name="MCP SDK session manager")
        waiting = asyncio.ensure_future(started.wait())
        await asyncio.wait({waiting, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set():
            waiting.cancel()
            await self._task  # raises why it could not start

    async def stop(self) -> None:
        """End the manager (requests still inside the SDK are cancelled)."""
        if self._task is None:
            return
        self._stopping.set()
        task, self._task = self._task, None
        await task

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request (its body re-fed by ``receive``)."""
        await self._manager.handle_request(scope, receive, send)
