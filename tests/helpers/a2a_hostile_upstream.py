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
from dataclasses import dataclass
from typing import Any

import grpc
from a2a.types import a2a_pb2_grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from tests.helpers.agents import Pki

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
