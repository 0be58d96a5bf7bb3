"""One MCP server this agent fronts: its connection, its pinned tools, and calls to them.

This is the boundary where MCP SDK, process and HTTP failures are translated:

* the server cannot be reached or started, or its connection ends while a call
  waits (a stdio server that exits, a dropped connection) ->
  ``UpstreamUnavailable`` (PEER_UNAVAILABLE; the audit detail says which);
* an answer that is not MCP (over ``max_answer_bytes``, not JSON-RPC, not a
  tool result), or a result without the output its pinned contract promises
  -> ``None``, which the capability runner reports as INVALID_OUTPUT (a
  ``structuredContent`` or text that breaks the contract: the runner's own check);
* a tool error (``isError``) or a JSON-RPC error from the server ->
  :class:`McpServerFailed`, a plain exception the runner reports as
  CAPABILITY_FAILED. The server's text is never passed on or logged.

Timeouts are the capability runner's (CAPABILITY_TIMEOUT): the SDK's own
deadline is set a little later. A cancelled call (its caller's deadline, or
its caller gone) is cancelled at the server too (the SDK sends
``notifications/cancelled``, or closes the request's stream).

The connection is opened at start (the tools are listed and pinned then) and
reopened when it has ended: a stdio server is restarted on the next call, no
sooner than its back-off allows (half a second, doubling up to
``restart_backoff_max``, reset by a call that succeeds); calls meanwhile fail
PEER_UNAVAILABLE at once rather than pile up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from capabilities.context import CallEvents
from gateway.client.mcp.http_link import HttpState, http_link
from gateway.client.mcp.stdio_link import UNREADABLE_ANSWER, StdioState, stdio_link
from gateway.client.mcp.tool_pins import PinnedTool, pin_tools
from gateway.config import McpUpstreamEntry, TlsSettings
from gateway.errors import GatewayError, UpstreamUnavailable
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)

SDK_DEADLINE_MARGIN_SECONDS = 1.0
"""The SDK's own deadline for a call trails the capability's timeout by this much."""
FIRST_BACKOFF_SECONDS = 0.5
CLOSE_SECONDS = 10.0
"""The longest a connection may take to close (a stdio server's own stop takes up to 4 s)."""
MAX_LIST_PAGES = 100
"""``tools/list`` pages read at start at most (a server that pages forever is refused)."""
CLIENT_INFO = types.Implementation(name="a2a-peer-gateway", version="1")
SDK_CONNECTION_ENDED = ("Connection closed", "SSE stream ")
"""How the MCP SDK's own errors for a lost connection or event stream begin."""


class McpServerFailed(Exception):
    """The MCP server answered, with a tool error or a JSON-RPC error (never its text)."""


Progress = Callable[[float, float | None, str | None], Awaitable[None]]


class _Link:
    """One connection (a started process, or an HTTP session), held by a task of its own:
    the SDK's task groups must be left by the task that entered them."""

    def __init__(self, entry: McpUpstreamEntry, tls: TlsMaterial, files: TlsSettings) -> None:
        self.state: StdioState | HttpState = StdioState() if entry.stdio else HttpState()
        self.session: Any = None
        self._entry, self._tls, self._files = entry, tls, files
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Open and not ended (a stdio server's stdout still open)."""
        ended = isinstance(self.state, StdioState) and self.state.ended
        return self._task is not None and not self._task.done() and not ended

    async def open(self) -> None:
        """Connect and negotiate the protocol (raises why not)."""
        ready = asyncio.Event()
        self._task = asyncio.create_task(self._run(ready), name=f"MCP {self._entry.label}")
        waiting = asyncio.ensure_future(ready.wait())
        try:
            await asyncio.wait({waiting, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not ready.is_set():
            await self._task  # raises what ended it

    async def _run(self, ready: asyncio.Event) -> None:
        entry = self._entry
        if isinstance(self.state, StdioState):
            transport: Any = stdio_link(entry, self.state)
        else:
            transport = http_link(entry, self._tls, self._files, self.state)
        async with Client(transport, mode="auto", cache=None, client_info=CLIENT_INFO) as client:
            self.session = client.session
            ready.set()
            await self._closing.wait()

    async def close(self) -> None:
        """End the connection (a stdio server is stopped), interrupting a handshake still
        under way, and at most after :data:`CLOSE_SECONDS` whatever the SDK does."""
        self._closing.set()
        task = self._task
        if task is None:
            return
        if self.session is None:
            task.cancel()  # still connecting: it never reaches the wait on _closing
        done, _ = await asyncio.wait({task}, timeout=CLOSE_SECONDS)
        if not done:
            task.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await task


class McpUpstream:
    """One reused connection to one MCP server (``[[mcp_upstreams]]``)."""

    def __init__(self, entry: McpUpstreamEntry, tls: TlsMaterial, files: TlsSettings) -> None:
        self.entry = entry
        self._tls = tls
        self._files = files
        self._link: _Link | None = None
        self._lock = asyncio.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._closing: dict[asyncio.Task[None], _Link] = {}
        """Links being closed in the background (dropped, or retired by a rotation)."""
        self.tools: dict[str, PinnedTool] = {}
        """The configured tools as the server listed them at start (after :meth:`start`)."""

    @property
    def name(self) -> str:
        """``mcp:NAME``: how audit details, logs and ``UpstreamUnavailable`` name it."""
        return self.entry.label

    async def start(self) -> dict[str, PinnedTool]:
        """Connect, list the tools and pin the configured ones (within ``start_timeout``).

        Raises:
            UpstreamUnavailable: the server could not be reached or started in time.
            AgentConfigError: a configured tool is not listed or cannot be pinned.
        """
        try:
            async with asyncio.timeout(self.entry.start_timeout):
                link = await self._connect_at_start()
                listed = await _listed_tools(link.session)
        except TimeoutError as err:
            raise UpstreamUnavailable(
                f"MCP server {self.name} did not answer within {self.entry.start_timeout:g} s",
                upstream=self.name,
            ) from err
        except (MCPError, ValidationError) as err:
            raise UpstreamUnavailable(
                f"MCP server {self.name} did not list its tools ({type(err).__name__})",
                upstream=self.name,
            ) from err
        self.tools = pin_tools(self.entry, listed)
        self._failures = 0
        return self.tools

    async def _connect_at_start(self) -> _Link:
        pause = FIRST_BACKOFF_SECONDS
        while True:
            try:
                return await self._connected()
            except UpstreamUnavailable as err:
                _log.info("MCP server %s not ready yet: %s", self.name, err.detail or err.message)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def call(
        self, tool: PinnedTool, arguments: dict[str, Any], budget: float, events: CallEvents | None
    ) -> Any:
        """Call ``tool`` with ``arguments``; its output, or None when the answer is unusable.

        Raises:
            UpstreamUnavailable: the server cannot be reached, or its connection ended.
            McpServerFailed: the server answered with an error.
        """
        link = await self._usable_link()
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool.config.tool, arguments=arguments)
        )
        try:
            result = await link.session.send_request(
                request,
                types.CallToolResult,
                request_read_timeout_seconds=budget + SDK_DEADLINE_MARGIN_SECONDS,
                progress_callback=_progress(events),
            )
        except MCPError as err:
            return await self._failed(link, err)
        except ValidationError:
            return None  # an answer, but not a tool result
        self._failures = 0
        return answer_output(result, tool)

    async def _failed(self, link: _Link, err: MCPError) -> None:
        """None (unusable answer) for what the server sent; raise for an error or a lost link."""
        if link.state.oversized:
            if isinstance(link.state, StdioState):
                await self._drop(link)  # the stream cannot be trusted past a cut message
            else:
                link.state.oversized = False  # one HTTP answer was cut: the next is its own
            return None
        if err.error.message == UNREADABLE_ANSWER:
            return None  # one unreadable line: the next one is read afresh
        if _connection_ended(err) or not link.alive:
            await self._drop(link)
            raise UpstreamUnavailable(
                "the MCP server's connection ended during the call",
                upstream=self.name,
                detail=f"{self.name}: connection ended",
            ) from err
        raise McpServerFailed(f"MCP server {self.name} answered error {err.error.code}") from err

    async def _usable_link(self) -> _Link:
        link = self._link
        if link is not None and link.alive:
            return link
        async with self._lock:
            if self._link is not None and self._link.alive:
                return self._link
            if self._link is not None:
                await self._drop(self._link)
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise UpstreamUnavailable(
                    f"MCP server {self.name} is restarting (next attempt in {wait:.1f} s)",
                    upstream=self.name,
                    detail=f"{self.name}: backing off",
                )
            return await self._connected()

    async def _connected(self) -> _Link:
        """A new link; UpstreamUnavailable (and the back-off grows) if it cannot be made."""
        link = _Link(self.entry, self._tls, self._files)
        try:
            await link.open()
        except (GatewayError, asyncio.CancelledError):
            await link.close()
            raise
        except Exception as err:
            await link.close()
            self._failures += 1
            backoff = FIRST_BACKOFF_SECONDS * 2 ** (self._failures - 1)
            self._retry_at = time.monotonic() + min(backoff, self.entry.restart_backoff_max)
            raise UpstreamUnavailable(
                f"could not connect to MCP server {self.name}",
                upstream=self.name,
                detail=f"{self.name}: {type(err).__name__}",
            ) from err
        self._link = link
        return link

    async def _drop(self, link: _Link) -> None:
        """Stop using ``link``; it closes in the background (a stdio server may take seconds
        to stop, and the call that found it broken is answered at once)."""
        if self._link is link:
            self._link = None
            self._failures += 1
            backoff = FIRST_BACKOFF_SECONDS * 2 ** (self._failures - 1)
            self._retry_at = time.monotonic() + min(backoff, self.entry.restart_backoff_max)
        self._close_later(link, 0.0)

    def _close_later(self, link: _Link, delay: float) -> None:
        async def close() -> None:
            await asyncio.sleep(delay)
            await link.close()

        task = asyncio.create_task(close())
        self._closing[task] = link
        task.add_done_callback(lambda done: self._closing.pop(done, None))

    def use_tls(self, material: TlsMaterial, grace: float) -> None:
        """Connect with ``material`` from now on; an open HTTP link is replaced on the next
        call, and closed ``grace`` seconds later (calls on it may finish)."""
        self._tls = material
        link = self._link
        if link is None or self.entry.stdio:
            return
        self._link = None
        self._close_later(link, grace)

    async def close(self) -> None:
        """Close every connection now (a stdio server is stopped)."""
        links = [*self._closing.values(), *([self._link] if self._link else [])]
        for task in list(self._closing):
            task.cancel()  # a retired link waiting out its grace is closed now
        self._link = None
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)


def _connection_ended(err: MCPError) -> bool:
    """True if the SDK says the connection (or the call's event stream) ended.

    Its code, -32000, is also JSON-RPC's "server error", which servers answer
    with: such an answer is the server's, not a lost connection. The SDK's own
    errors carry no data and say so in words of their own.
    """
    error = err.error
    return (
        error.code == CONNECTION_CLOSED
        and error.data is None
        and error.message.startswith(SDK_CONNECTION_ENDED)
    )


def answer_output(result: types.CallToolResult, tool: PinnedTool) -> Any:
    """The output a tool result stands for (None: it holds none; a tool error raises)."""
    if result.is_error:
        raise McpServerFailed("the MCP server answered a tool error")
    if tool.structured:
        return result.structured_content
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return {"text": "".join(texts)} if texts else None


def _progress(events: CallEvents | None) -> Progress | None:
    """The server's progress notifications as the capability's own progress reports."""
    if events is None:
        return None

    async def forward(progress: float, total: float | None, message: str | None) -> None:
        if message:
            text = message
        else:
            text = f"{progress:g}/{total:g}" if total is not None else f"{progress:g}"
        await events.progress(text)

    return forward


async def _listed_tools(session: Any) -> list[types.Tool]:
    """Every page of ``tools/list`` (at most :data:`MAX_LIST_PAGES`, no cursor twice)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
        if cursor in seen:
            break
        seen.add(cursor)
    raise UpstreamUnavailable("the MCP server's tools/list does not end")
