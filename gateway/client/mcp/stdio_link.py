"""A local MCP server the agent starts, spoken to over its stdin and stdout, bounded.

The MCP SDK's own stdio client reads lines of any length and logs what it
cannot parse; this transport gives the SDK's session the same two streams
(JSON-RPC messages in, out) with the server held to these rules:

* it runs in a session (process group) of its own, with only the variables
  ``[[mcp_upstreams]]`` gives it (``env``, ``inherit_env``) and a few of the
  agent's (``PATH``, ``HOME``, ...); closing the link closes its stdin, then
  ends the whole group (SIGTERM, then SIGKILL);
* one line (one message) is at most ``max_answer_bytes``: a longer one ends
  the link (the call in flight fails ``INVALID_OUTPUT``, and the server is
  restarted on the next call), and no more than that is ever buffered;
* a line that is not a JSON-RPC message is dropped, and if it names a request
  id, that request fails with :data:`UNREADABLE_ANSWER`; its content is never
  logged;
* its standard error goes to ``stderr_file`` (appended, 0600) or is read and
  dropped, its size logged when the server exits: never its text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import orjson
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError, jsonrpc_message_adapter
from pydantic import ValidationError

from gateway.config import McpUpstreamEntry

_log = logging.getLogger(__name__)

INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG")
"""The agent's environment variables every stdio server gets (besides ``inherit_env``)."""
UNREADABLE_ANSWER = "a2agw: the MCP server's answer is not a JSON-RPC message"
"""The error message a request gets whose answer could not be read."""
STOP_SECONDS = 2.0
"""How long the server has to exit once its stdin closes, then once it is sent SIGTERM."""


@dataclass
class StdioState:
    """What happened to one run of the server (read by the upstream once a call fails).

    Attributes:
        oversized: It sent a message longer than ``max_answer_bytes``.
        ended: Its stdout closed (it exited, or closed it).
        stderr_bytes: Bytes it wrote to its standard error (when not kept in a file).
    """

    oversized: bool = False
    ended: bool = False
    stderr_bytes: int = 0


def server_environment(entry: McpUpstreamEntry) -> dict[str, str]:
    """The environment of ``entry``'s server: a few of the agent's variables, the named
    ``inherit_env`` ones, then ``env``."""
    names = (*INHERITED, *entry.inherit_env)
    return {name: os.environ[name] for name in names if name in os.environ} | entry.env


@contextlib.asynccontextmanager
async def stdio_link(entry: McpUpstreamEntry, state: StdioState) -> AsyncIterator[TransportStreams]:
    """Start ``entry``'s server and yield the session's streams; stop it on exit.

    Raises:
        OSError: the program cannot be started (not found, not executable).
    """
    assert entry.command is not None
    process = await _spawn(entry)
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](16)
    tasks = [
        asyncio.create_task(_read_stdout(process, entry, incoming_send, state)),
        asyncio.create_task(_write_stdin(process, outgoing_receive, incoming_send)),
    ]
    if process.stderr is not None:
        tasks.append(asyncio.create_task(_drain_stderr(process.stderr, state)))
    try:
        yield incoming, outgoing
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(process)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in (incoming_send, incoming, outgoing, outgoing_receive):
                await stream.aclose()
            _log_exit(entry, process, state)


async def _spawn(entry: McpUpstreamEntry) -> asyncio.subprocess.Process:
    assert entry.command is not None
    stderr: int = asyncio.subprocess.PIPE
    if entry.stderr_file is not None:
        stderr = os.open(entry.stderr_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        return await asyncio.create_subprocess_exec(
            entry.command,
            *entry.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=server_environment(entry),
            cwd=entry.cwd,
            start_new_session=True,  # its own process group: ended as a whole
            limit=entry.max_answer_bytes + 1,
        )
    finally:
        if stderr != asyncio.subprocess.PIPE:
            os.close(stderr)


async def _read_stdout(
    process: asyncio.subprocess.Process,
    entry: McpUpstreamEntry,
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    state: StdioState,
) -> None:
    assert process.stdout is not None
    unreadable = 0
    try:
        while True:
            try:
                line = await process.stdout.readline()
            except ValueError:  # longer than the limit: the stream cannot be resynchronised
                state.oversized = True
                _log.warning(
                    "MCP server %s sent a message over %d bytes; restarting it on the next call",
                    entry.label,
                    entry.max_answer_bytes,
                )
                return
            if not line:
                return
            if not line.strip():
                continue
            message = _message(line)
            if message is None:
                unreadable += 1
                if unreadable == 1:  # never the content: it may be anybody's payload
                    _log.warning("MCP server %s wrote a line that is not JSON-RPC", entry.label)
                continue
            await incoming.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        return
    finally:
        state.ended = True
        with contextlib.suppress(anyio.ClosedResourceError):
            await incoming.aclose()  # the session sees the connection end


def _message(line: bytes) -> SessionMessage | None:
    """The line as a message; an unreadable answer to a known request id as an error to it."""
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except (ValidationError, ValueError):
        pass
    try:
        decoded = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    request_id = decoded.get("id") if isinstance(decoded, dict) else None
    if isinstance(request_id, str | int) and not isinstance(request_id, bool):
        error = ErrorData(code=-32603, message=UNREADABLE_ANSWER)
        return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    return None


async def _write_stdin(
    process: asyncio.subprocess.Process,
    outgoing: MemoryObjectReceiveStream[SessionMessage],
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    assert process.stdin is not None
    try:
        async for message in outgoing:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            process.stdin.write(data.encode() + b"\n")
            await process.stdin.drain()
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
        # The server no longer reads: the session must see the link end, not wait.
        with contextlib.suppress(anyio.ClosedResourceError):
            await incoming.aclose()


async def _drain_stderr(stderr: asyncio.StreamReader, state: StdioState) -> None:
    while chunk := await stderr.read(65536):
        state.stderr_bytes += len(chunk)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Close its stdin and let it exit; else SIGTERM, then SIGKILL, to its whole group."""
    if process.stdin is not None and not process.stdin.is_closing():
        process.stdin.close()
    for sent in (None, signal.SIGTERM, signal.SIGKILL):
        if sent is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sent)
        if await _exited(process, STOP_SECONDS):
            break
    # A child it started may still hold a pipe: end its group too (it is ours).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether it exited within ``timeout`` (its return code polled: ``wait()`` would also
    wait for pipes a child of it may hold)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while process.returncode is None:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _log_exit(
    entry: McpUpstreamEntry, process: asyncio.subprocess.Process, state: StdioState
) -> None:
    kept = f"kept in {entry.stderr_file}" if entry.stderr_file is not None else "dropped"
    _log.info(
        "MCP server %s stopped (exit %s); it wrote %d bytes to its standard error (%s)",
        entry.label,
        process.returncode,
        state.stderr_bytes,
        kept,
    )
