"""Helpers of the MCP suites: an agent serving ``[mcp] listen``, and MCP clients of it.

The official MCP Python SDK's client (``mcp.client.client.Client``) talks to the
agent over mTLS through an ``httpx2`` client presenting a caller's SVID; raw
JSON-RPC posts (``httpx``) check what a client of the SDK would never send.
The agent listens on ``localhost`` with an SVID that also names ``localhost``
(``tests.a2a_http_support``), so standard HTTPS clients verify its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.config import AgentConfig, McpSettings
from tests.a2a_http_support import https_certificate
from tests.support import Pki

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ACCEPT_BOTH = "application/json, text/event-stream"


def serving_mcp(config: AgentConfig, pki: Pki, folder: Path) -> AgentConfig:
    """``config`` with ``[mcp] listen = "localhost:0"`` and an SVID naming localhost."""
    name = config.id.rsplit("/", 1)[-1]
    cert, key = https_certificate(pki, name, folder)
    return config.model_copy(
        update={
            "tls": config.tls.model_copy(update={"cert": cert, "key": key}),
            "mcp": McpSettings(listen="localhost:0"),
        }
    )


def tls_context(pki: Pki, caller: str | None) -> ssl.SSLContext:
    """A client context trusting the session CA, presenting ``caller``'s SVID if given."""
    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    if caller is not None:
        context.load_cert_chain(pki.dir / f"{caller}.pem", pki.dir / f"{caller}.key")
    return context


@contextlib.asynccontextmanager
async def sdk_client(url: str, pki: Pki, caller: str | None) -> AsyncIterator[Client]:
    """The MCP SDK's client of ``url``, connected (its default: the newest revision it and
    the server share), presenting ``caller``'s certificate."""
    async with httpx2.AsyncClient(verify=tls_context(pki, caller), timeout=20.0) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def raw_client(pki: Pki, caller: str | None) -> httpx.AsyncClient:
    """An httpx client for hand-made requests, presenting ``caller``'s certificate."""
    return httpx.AsyncClient(verify=tls_context(pki, caller), timeout=20.0)


def modern_call(
    name: str,
    arguments: dict[str, Any] | None,
    *,
    request_id: int | str = 1,
    meta: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 ``tools/call`` body and the headers that revision requires."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        **(meta or {}),
    }
    params: dict[str, Any] = {"name": name, "_meta": envelope}
    if arguments is not None:
        params["arguments"] = arguments
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    headers = {
        "Accept": ACCEPT_BOTH,
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    return body, headers


def legacy_request(
    method: str, params: dict[str, Any] | None = None, *, request_id: int | str | None = 1
) -> tuple[dict[str, Any], dict[str, str]]:
    """A handshake-era (2025-11-25) message (``request_id`` None: a notification)."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        body["id"] = request_id
    if params is not None:
        body["params"] = params
    headers = {"Accept": ACCEPT_BOTH, "MCP-Protocol-Version": LEGACY}
    return body, headers


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an event stream's ``data:`` lines, in order."""
    import json

    return [
        json.loads(line.removeprefix("data:").strip())
        for line in text.splitlines()
        if line.startswith("data:")
    ]


@contextlib.asynccontextmanager
async def served_app(app: Any, tls: tuple[Path, Path, Path] | None = None) -> AsyncIterator[int]:
    """``app`` (with its lifespan) under uvicorn on 127.0.0.1:0; yields the port.

    ``tls``: (certificate, key, CA) to serve HTTPS requiring a client certificate
    from that CA.
    """
    import uvicorn

    from gateway.http.listener import bind_socket

    settings: dict[str, Any] = {}
    if tls is not None:
        cert, key, ca = tls
        settings = {
            "ssl_certfile": str(cert),
            "ssl_keyfile": str(key),
            "ssl_ca_certs": str(ca),
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        }
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, **settings)
    server = uvicorn.Server(config)
    sock = bind_socket("127.0.0.1", 0)
    config.load()
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    loop = asyncio.create_task(server.main_loop())
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await loop
        await server.shutdown(sockets=[sock])
        sock.close()
