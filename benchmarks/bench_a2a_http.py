"""The JSON-RPC half of ``bench_a2a.py``: the a2a-sdk's own JSON-RPC server, and a client target.

The sdk baseline serves the same echo agent (``DefaultRequestHandler`` with
``InMemoryTaskStore`` and the echo executor of ``bench_a2a``) through the
a2a-sdk's ``create_jsonrpc_routes`` on Starlette, served by uvicorn (h11, as
the gateway) over TLS that requires the same client certificate. The gateway
serves ``[a2a] http_listen`` (the same routes, then our handler: identity,
policy, replay, validation, audit). Both are called with one httpx client
each (HTTP/1.1 keep-alive, up to 32 connections), with the server's SVID DNS
name as the TLS server name.

``FloorJsonRpcServer`` is the floor of this stack: the same uvicorn, TLS and
Starlette, and a route that parses the body and echoes the data part back in a
completed task, with no A2A types, checks, store or audit. What it reaches
through this client is the most any server built on this stack can reach here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_jsonrpc_routes
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config import AgentConfig
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.server.a2a_http.server import KEEP_ALIVE_SECONDS
from gateway.transport.tls import TlsMaterial
from policies.identity import svid_dns_name

CALL_TIMEOUT_SECONDS = 20.0


class SdkJsonRpcServer:
    """The a2a-sdk's JSON-RPC routes for ``handler``, under uvicorn with TLS, on 127.0.0.1:0."""

    def __init__(self, handler: DefaultRequestHandler, config: AgentConfig) -> None:
        self._serve(Starlette(routes=create_jsonrpc_routes(handler, JSONRPC_PATH)), config)

    def _serve(self, app: Starlette, config: AgentConfig) -> None:
        self._config = uvicorn.Config(
            app,
            http="h11",
            lifespan="off",
            log_level="warning",
            access_log=False,
            ssl_certfile=str(config.tls.cert),
            ssl_keyfile=str(config.tls.key),
            ssl_ca_certs=str(config.tls.ca),
            ssl_cert_reqs=ssl.CERT_REQUIRED,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,  # as the gateway's (see a2a_http.server)
        )
        self._server = uvicorn.Server(self._config)
        # As uvicorn binds it itself (TCP_NODELAY on accepted sockets: see a2a_http.server).
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self._loop: asyncio.Task[None] | None = None
        self.port: int = self._sock.getsockname()[1]

    async def start(self) -> int:
        """Serve (without uvicorn's signal handlers); returns the port."""
        self._config.load()
        self._server.lifespan = self._config.lifespan_class(self._config)
        await self._server.startup(sockets=[self._sock])
        self._loop = asyncio.create_task(self._server.main_loop())
        return self.port

    async def stop(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        if self._loop is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        await self._server.shutdown(sockets=[self._sock])


class FloorJsonRpcServer(SdkJsonRpcServer):
    """A null echo ``SendMessage`` route on the same stack: the most this stack reaches."""

    def __init__(self, config: AgentConfig) -> None:
        app = Starlette(routes=[Route(JSONRPC_PATH, _floor_send_message, methods=["POST"])])
        self._serve(app, config)


async def _floor_send_message(request: Request) -> Response:
    body = json.loads(await request.body())
    task = {
        "id": uuid.uuid4().hex,
        "contextId": uuid.uuid4().hex,
        "status": {"state": "TASK_STATE_COMPLETED"},
        "artifacts": [{"artifactId": "echo", "parts": body["params"]["message"]["parts"]}],
    }
    answer = {"jsonrpc": "2.0", "id": body["id"], "result": {"task": task}}
    return Response(json.dumps(answer), media_type="application/json")


def jsonrpc_client(caller: TlsMaterial) -> httpx.AsyncClient:
    """One keep-alive httpx client presenting the caller's SVID."""
    context = ssl.create_default_context(cadata=caller.ca_pem.decode())
    with _key_files(caller) as (cert, key):
        context.load_cert_chain(cert, key)
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    return httpx.AsyncClient(verify=context, limits=limits, timeout=CALL_TIMEOUT_SECONDS)


@contextlib.contextmanager
def _key_files(material: TlsMaterial) -> Any:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert.write_bytes(material.cert_pem)
        key.write_bytes(material.key_pem)
        yield cert, key


@dataclass
class JsonRpcTarget:
    """A JSON-RPC SendMessage endpoint, over one httpx client."""

    name: str
    url: str
    client: httpx.AsyncClient
    server_id: str
    binding: str = "jsonrpc"
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    async def call(self, params: dict[str, Any], text: str) -> float:
        """One SendMessage with a fresh message id; returns its latency in ms."""
        self.sent += 1
        params["message"]["messageId"] = uuid.uuid4().hex
        body = {"jsonrpc": "2.0", "id": self.sent, "method": "SendMessage", "params": params}
        started = time.perf_counter()
        try:
            response = await self.client.post(
                self.url,
                json=body,
                headers={"A2A-Version": "1.0"},
                extensions={"sni_hostname": svid_dns_name(self.server_id)},
            )
            answer = response.json()
        except (httpx.HTTPError, ValueError) as err:
            self.errors.append(f"{type(err).__name__}: {err}")
            return (time.perf_counter() - started) * 1000.0
        latency = (time.perf_counter() - started) * 1000.0
        task = (answer.get("result") or {}).get("task") or {}
        if task.get("status", {}).get("state") != "TASK_STATE_COMPLETED":
            self.errors.append(f"answer {str(answer)[:200]}")
        elif task["artifacts"][0]["parts"][0]["data"]["text"] != text:
            self.errors.append("the echo did not return the text")
        return latency

    async def close(self) -> None:
        """Close the client."""
        await self.client.aclose()


def jsonrpc_params(text: str) -> dict[str, Any]:
    """SendMessage params (JSON form) with one data part ``{"text": ...}``."""
    return {
        "message": {
            "messageId": "",
            "role": "ROLE_USER",
            "parts": [{"data": {"text": text}}],
            "metadata": {"a2agw.capability": "text.echo"},
        }
    }
