"""Hostile upstream A2A agents: they receive the call, then answer what a test chooses.

* ``RawGrpcUpstream``: a gRPC server for ``lf.a2a.v1.A2AService/SendMessage``
  (mTLS with a session-PKI certificate) that answers raw bytes, or aborts with
  a status (plain or rich) of the test's choosing.
* ``RawHttpUpstream``: a bare HTTP/1.1 server on 127.0.0.1 that reads one
  request and writes the raw bytes a test builds from the request's JSON-RPC
  id (any status, headers, encoding), or closes the connection unanswered;
  with ``hold_open``, it then keeps the connection (an unfinished body) until
  the client closes it.
* ``scripted_grpc_upstream``: serves a test's own ``A2AServiceServicer``
  (any answer, stream or stall per RPC) with mTLS.

Both count the requests they received, so a test can prove the call reached
the upstream (and may have run there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import json_format
from google.rpc import status_pb2
from grpc_status import rpc_status

from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import V1, A2APeer, data_request
from tests.helpers.agents import Pki
from tests.helpers.fronting import client, records

SEND_MESSAGE_SERVICE = "lf.a2a.v1.A2AService"

HttpAnswer = Callable[[object], bytes | None]
"""The raw HTTP response for a request with this JSON-RPC id; None: close unanswered."""


@dataclass
class RawGrpcUpstream:
    """What the fake answers: ``answer`` bytes, else abort with ``status``/``rich``."""

    answer: bytes = b""
    status: tuple[grpc.StatusCode, str] | None = None
    rich: status_pb2.Status | None = None
    received: int = 0

    async def _send_message(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.received += 1
        if self.rich is not None:
            await context.abort_with_status(rpc_status.to_status(self.rich))
        if self.status is not None:
            await context.abort(*self.status)
        return self.answer


@contextlib.asynccontextmanager
async def raw_grpc_upstream(
    fake: RawGrpcUpstream, pki: Pki, cert_name: str = "legacy"
) -> AsyncIterator[str]:
    """Serve ``fake`` with mTLS on 127.0.0.1:0 as ``cert_name``; yields ``host:port``."""
    server = grpc.aio.server()
    pki.ensure(cert_name)
    port = server.add_secure_port("127.0.0.1:0", pki.material(cert_name).server_credentials())
    handler = grpc.unary_unary_rpc_method_handler(fake._send_message)  # raw bytes both ways
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SEND_MESSAGE_SERVICE, {"SendMessage": handler})]
    )
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def scripted_grpc_upstream(
    servicer: a2a_pb2_grpc.A2AServiceServicer,
    pki: Pki,
    cert_name: str = "legacy",
    *,
    options: tuple[tuple[str, Any], ...] = (),
) -> AsyncIterator[str]:
    """Serve ``servicer`` with mTLS on 127.0.0.1:0 as ``cert_name``; yields ``host:port``."""
    server = grpc.aio.server(options=list(options))
    pki.ensure(cert_name)
    port = server.add_secure_port("127.0.0.1:0", pki.material(cert_name).server_credentials())
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(servicer, server)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def http_response(
    body: bytes, *, status: str = "200 OK", headers: dict[str, str] | None = None
) -> bytes:
    """One raw HTTP/1.1 response (``Content-Type: application/json`` unless given)."""
    fields = {"Content-Type": "application/json", **(headers or {})}
    fields["Content-Length"] = str(len(body))
    fields["Connection"] = "close"
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode("latin-1") + body


def jsonrpc_body(request_id: object, **members: object) -> bytes:
    """A JSON-RPC 2.0 response object with ``members`` (``result=...`` / ``error=...``)."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id, **members}).encode()


@dataclass
class RawHttpUpstream:
    """Answers each request with ``answer(its JSON-RPC id)``; counts what it received."""

    answer: HttpAnswer
    received: int = 0
    hold_open: bool = False
    """Keep the connection after the answer's bytes until the client closes it (30 s at most)."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await asyncio.wait_for(reader.readexactly(length), 10)
            self.received += 1
            raw = self.answer(json.loads(body).get("id"))
            if raw is not None:
                writer.write(raw)
                await writer.drain()
            if self.hold_open:
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def raw_http_upstream(fake: RawHttpUpstream) -> AsyncIterator[str]:
    """Serve ``fake`` (plaintext, loopback); yields its JSON-RPC URL."""
    server = await asyncio.start_server(fake._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/a2a/jsonrpc"
    finally:
        server.close()
        await server.wait_closed()


TASK = "t1"
WORKING = a2a_pb2.TASK_STATE_WORKING
COMPLETED = a2a_pb2.TASK_STATE_COMPLETED


def task_event(state: int, artifacts: dict[str, str] | None = None) -> a2a_pb2.StreamResponse:
    event = a2a_pb2.StreamResponse()
    event.task.id, event.task.context_id = TASK, "c"
    event.task.status.state = state  # type: ignore[assignment]
    for artifact_id, text in (artifacts or {}).items():
        event.task.artifacts.add(artifact_id=artifact_id).parts.add(text=text)
    return event


def status_event(state: int) -> a2a_pb2.StreamResponse:
    event = a2a_pb2.StreamResponse()
    update = event.status_update
    update.task_id, update.context_id = TASK, "c"
    update.status.state = state  # type: ignore[assignment]
    return event


def artifact_event(part: a2a_pb2.Part, *, append: bool, last: bool) -> a2a_pb2.StreamResponse:
    event = a2a_pb2.StreamResponse()
    update = event.artifact_update
    update.task_id, update.context_id = TASK, "c"
    update.append, update.last_chunk = append, last
    update.artifact.artifact_id = "a"
    update.artifact.parts.add().CopyFrom(part)
    return event


def data(value: dict[str, Any]) -> a2a_pb2.Part:
    part = a2a_pb2.Part()
    json_format.ParseDict(value, part.data)
    return part


def completed_answer(text: str = "fine") -> a2a_pb2.SendMessageResponse:
    answer = a2a_pb2.SendMessageResponse()
    answer.task.CopyFrom(task_event(COMPLETED, {"answer": text}).task)
    return answer


@dataclass
class Scripted(a2a_pb2_grpc.A2AServiceServicer):
    """An upstream agent answering what the test set, and recording what reached it."""

    stream: list[a2a_pb2.StreamResponse] = field(default_factory=list)
    """What ``SendStreamingMessage`` sends; the stream then stays open until the client ends it."""
    answer: a2a_pb2.SendMessageResponse = field(default_factory=completed_answer)
    stall_cancel: bool = False
    """``CancelTask`` never answers: it waits until the client gives the call up."""
    cancels: list[str] = field(default_factory=list)
    open_streams: int = 0
    given_up_cancels: int = 0

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.SendMessageResponse:
        return self.answer

    async def GetTask(
        self, request: a2a_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        return task_event(WORKING).task

    async def SendStreamingMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        self.open_streams += 1
        try:
            for event in self.stream:
                yield event
            await asyncio.Event().wait()
        finally:
            self.open_streams -= 1

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        self.cancels.append(request.id)
        if self.stall_cancel:
            try:
                await asyncio.Event().wait()
            finally:
                self.given_up_cancels += 1
        task = task_event(a2a_pb2.TASK_STATE_CANCELED).task
        task.id = request.id
        return task


async def eventually(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):  # bounded: 10 s
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def stream_from(
    pki: Pki,
    bob: Agent,
    payload: dict[str, Any] | None = None,
    *,
    capability: str = "legacy.echo",
    deadline: float = 30.0,
) -> tuple[list[a2a_pb2.StreamResponse], str]:
    """alice's streamed call through bob: the events and how the stream ended ("" if fine)."""
    request = data_request(capability, payload or {"text": "hi"})
    seen: list[a2a_pb2.StreamResponse] = []
    async with A2APeer(pki, bob, "alice") as alice:
        call = alice.stub.SendStreamingMessage(request, metadata=V1, timeout=deadline)
        try:
            async for event in call:
                seen.append(event)
        except grpc.aio.AioRpcError as err:
            return seen, err.code().name
    return seen, ""


def ending(seen: list[a2a_pb2.StreamResponse]) -> tuple[str, str]:
    """The last status of alice's task and its reason (a2agw.reason)."""
    status = seen[-1].status_update.status
    metadata = status.message.metadata
    reason = metadata["a2agw.reason"] if "a2agw.reason" in metadata else ""
    return a2a_pb2.TaskState.Name(status.state), reason


async def audited(bob: Agent) -> list[tuple[str, str]]:
    return [(r.reason, r.detail) for r in await records(bob)]


async def still_serving(pki: Pki, bob: Agent) -> Any:
    """A blocking call after the hostile one, once bob has given every in-flight slot back."""
    await eventually(lambda: bob.limit_stats().in_flight_total == 0, "in-flight slot given back")
    async with client(pki, bob) as peer:
        return (await peer.invoke("legacy.echo", {"text": "again"})).output()
