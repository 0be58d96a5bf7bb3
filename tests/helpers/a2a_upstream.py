"""A real a2a-sdk agent to put behind the gateway, and what it received.

``SdkAgent`` is an ``AgentExecutor`` served by the SDK's own
``DefaultRequestHandler`` + ``InMemoryTaskStore``, over gRPC (mTLS with a
session-PKI certificate, or plaintext on loopback) or JSON-RPC (the SDK's
Starlette routes under uvicorn on a pre-bound 127.0.0.1 socket, plaintext or
https with client certificates). It records every message it receives (parts
and metadata) and answers according to ``mode``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
    a2a_pb2_grpc,
)
from google.protobuf import json_format, struct_pb2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.helpers.agents import Pki

JSONRPC_PATH = "/a2a/jsonrpc"


@dataclass(frozen=True)
class Received:
    """One message as the upstream saw it."""

    parts: list[dict[str, Any]]
    metadata: dict[str, Any]


@dataclass
class SdkAgent:
    """The executor's behaviour and its record of what reached it.

    ``mode``: ``echo`` (a completed task; text -> text artifact ``echo: TEXT``,
    data -> data artifact ``{"hits": [...], "seen": DATA}``), ``message`` (a
    direct Message reply), ``slow`` (waits for ``release``), ``progress`` (says
    "waiting for release" in its WORKING status, then waits), ``stream`` (says
    "streaming", sends two text chunks, then the echo answer), ``garbage`` (a
    completed task whose only part is ``data`` ``{"hits": "not a list"}``),
    ``fail`` (the task fails).
    """

    mode: str = "echo"
    received: list[Received] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: int = 0
    """How many CancelTask requests reached the executor."""

    def executor(self) -> AgentExecutor:
        return _Executor(self)


class _Executor(AgentExecutor):
    def __init__(self, agent: SdkAgent) -> None:
        self._agent = agent

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        parts = [json_format.MessageToDict(part) for part in message.parts]
        metadata = json_format.MessageToDict(message.metadata)
        self._agent.received.append(Received(parts, metadata))
        mode = self._agent.mode
        if mode == "message":
            reply = Message(
                message_id="reply-1",
                role=Role.ROLE_AGENT,
                parts=[Part(text="direct: "), Part(text=context.get_user_input())],
            )
            await event_queue.enqueue_event(reply)
            return
        await event_queue.enqueue_event(
            Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
            )
        )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        if mode == "progress":
            text = [Part(text="waiting for release")]
            await updater.start_work(updater.new_agent_message(text))
        if mode in ("slow", "progress"):
            await self._agent.release.wait()
        if mode == "stream":
            await updater.start_work(updater.new_agent_message([Part(text="streaming")]))
            for n in (1, 2):
                await updater.add_artifact(
                    [Part(text=f"chunk {n}")], artifact_id="chunks", append=n > 1, last_chunk=False
                )
        if mode == "fail":
            await updater.failed()
            return
        await updater.add_artifact(self._answer(message, mode), name="answer", last_chunk=True)
        await updater.complete()

    @staticmethod
    def _answer(message: Message, mode: str) -> list[Part]:
        if mode == "garbage":
            return [Part(data=json_format.ParseDict({"hits": "not a list"}, struct_pb2.Value()))]
        data = [json_format.MessageToDict(p.data) for p in message.parts if p.HasField("data")]
        if data:
            answer = {"hits": [str(data[0].get("query", ""))] * 2, "seen": data[0]}
            return [Part(data=json_format.ParseDict(answer, struct_pb2.Value()))]
        text = "".join(p.text for p in message.parts if p.HasField("text"))
        return [Part(text="echo: "), Part(text=text)]

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self._agent.cancelled += 1
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def card(url: str, binding: str) -> AgentCard:
    return AgentCard(
        name="Legacy",
        description="an existing a2a-sdk agent",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding=binding, protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(id="echo", name="Echo", description="echo", tags=["echo"]),
            AgentSkill(id="search", name="Search", description="search", tags=["search"]),
        ],
    )


def _handler(agent: SdkAgent, url: str, binding: str) -> DefaultRequestHandler:
    return DefaultRequestHandler(
        agent_executor=agent.executor(),
        task_store=InMemoryTaskStore(),
        agent_card=card(url, binding),
    )


@contextlib.asynccontextmanager
async def grpc_upstream(
    agent: SdkAgent, pki: Pki | None = None, cert_name: str = ""
) -> AsyncIterator[str]:
    """Serve ``agent`` over gRPC on 127.0.0.1:0 (mTLS with ``cert_name``'s cert if given)."""
    server = grpc.aio.server()
    address = "127.0.0.1:0"
    if pki is not None:
        pki.ensure(cert_name)
        port = server.add_secure_port(address, pki.material(cert_name).server_credentials())
    else:
        port = server.add_insecure_port(address)
    bound = f"127.0.0.1:{port}"
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(
        GrpcHandler(_handler(agent, bound, "GRPC")), server
    )
    await server.start()
    try:
        yield bound
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def jsonrpc_upstream(
    agent: SdkAgent,
    pki: Pki | None = None,
    cert_name: str = "",
    *,
    garbage: int = 0,
    sse: Sequence[bytes] = (),
    sse_type: str = "text/event-stream",
) -> AsyncIterator[str]:
    """Serve ``agent`` over JSON-RPC (https with client certs if ``pki``); yields the URL.

    ``garbage``: instead, the endpoint answers every POST with that many bytes:
    non-JSON below 1000, else a well-formed answer (a message of that much text).
    ``sse``: instead, it answers every POST with an SSE stream of these chunks
    (``Content-Type: sse_type``, with ``; charset=utf-8`` unless it names one).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    scheme = "https" if pki is not None else "http"
    url = f"{scheme}://127.0.0.1:{port}{JSONRPC_PATH}"
    if garbage:
        app = Starlette(routes=[Route(JSONRPC_PATH, _not_a2a(garbage), methods=["POST"])])
    elif sse:
        app = Starlette(routes=[Route(JSONRPC_PATH, _streamed(sse, sse_type), methods=["POST"])])
    else:
        handler = _handler(agent, url, "JSONRPC")
        app = Starlette(
            routes=create_agent_card_routes(agent_card=card(url, "JSONRPC"))
            + create_jsonrpc_routes(request_handler=handler, rpc_url=JSONRPC_PATH)
        )
    tls: dict[str, Any] = {}
    if pki is not None:
        pki.ensure(cert_name)
        tls = {
            "ssl_certfile": str(pki.dir / f"{cert_name}.pem"),
            "ssl_keyfile": str(pki.dir / f"{cert_name}.key"),
            "ssl_ca_certs": str(pki.dir / "ca.pem"),
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        }
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, log_level="warning", lifespan="off", **tls)
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(400):  # bounded: up to ~20 s on a busy runner
            if server.started or serving.done():
                break
            await asyncio.sleep(0.05)
        assert server.started, "uvicorn did not start"
        yield url
    finally:
        server.should_exit = True
        await serving
        sock.close()


def _not_a2a(size: int) -> Callable[[Request], Awaitable[Response]]:
    async def answer(request: Request) -> Response:
        if size < 1000:
            return PlainTextResponse(("<html>this is not JSON-RPC</html>" * size)[:size])
        request_id = (await request.json())["id"]
        message = {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x" * size}]}
        return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": {"message": message}})

    return answer


def _streamed(chunks: Sequence[bytes], media_type: str) -> Callable[[Request], Awaitable[Response]]:
    async def answer(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return StreamingResponse(body(), media_type=media_type)

    return answer


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
