"""Helpers of the A2A HTTP suites: an agent serving HTTPS, and mTLS HTTP clients of it.

Standard HTTPS clients check the URL's host against the server certificate,
so the agent here listens on ``localhost`` and serves an SVID minted with
``DNS:localhost`` besides its SVID DNS name (both within the dev CA's name
constraints). Not an ``IP:127.0.0.1`` SAN: BoringSSL (gRPC) refuses those
under the dev CA's IP name constraints ("unsupported name constraint type"),
which another branch fixes in ``pki issue``; a DNS name works on both ports
with every client. See docs/a2a-http.md for how an operator gets one.
"""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx

from gateway.config import AgentConfig
from gateway.server.a2a_http import JSONRPC_PATH
from policies.identity import svid_dns_name
from tests.support import Pki, spiffe


def https_certificate(pki: Pki, name: str, folder: Path) -> tuple[Path, Path]:
    """An SVID for ``name`` that also names ``localhost`` (for clients dialling that URL)."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = pki.ca.mint(
        uris=[spiffe(name)], dns_names=[svid_dns_name(spiffe(name)), "localhost"]
    )
    cert_path, key_path = folder / f"{name}-https.pem", folder / f"{name}-https.key"
    cert_path.write_bytes(cert)
    key_path.write_bytes(key)
    key_path.chmod(0o600)
    return cert_path, key_path


def serving_https(config: AgentConfig, pki: Pki, folder: Path) -> AgentConfig:
    """``config`` with ``[a2a] http_listen = "localhost:0"`` and an SVID naming localhost."""
    name = config.id.rsplit("/", 1)[-1]
    cert, key = https_certificate(pki, name, folder)
    return config.model_copy(
        update={
            "tls": config.tls.model_copy(update={"cert": cert, "key": key}),
            "a2a": config.a2a.model_copy(update={"http_listen": "localhost:0"}),
        }
    )


def client_context(pki: Pki, caller: str | None) -> ssl.SSLContext:
    """A TLS client context trusting the session CA, presenting ``caller``'s SVID if given."""
    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    if caller is not None:
        context.load_cert_chain(pki.dir / f"{caller}.pem", pki.dir / f"{caller}.key")
    return context


def https_client(pki: Pki, caller: str | None, **kwargs: Any) -> httpx.AsyncClient:
    """An httpx client presenting ``caller``'s certificate (None: no certificate)."""
    return httpx.AsyncClient(verify=client_context(pki, caller), timeout=10.0, **kwargs)


V1_HEADERS = {"A2A-Version": "1.0"}
JSON_HEADERS = {**V1_HEADERS, "Content-Type": "application/json"}
"""For a body sent as bytes (``content=``): the edge takes a body declared JSON only."""


def message_params(capability: str, data: Any, *, message_id: str | None = None) -> dict[str, Any]:
    """SendMessage params (JSON form) with one ``data`` part calling ``capability``."""
    return {
        "message": {
            "messageId": message_id or str(uuid.uuid4()),
            "role": "ROLE_USER",
            "parts": [{"data": data}],
            "metadata": {"a2agw.capability": capability},
        }
    }


def jsonrpc(method: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    """A JSON-RPC 2.0 request object."""
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def our_reason(details: list[dict[str, Any]]) -> str:
    """Our reason code from a JSON-RPC ``error.data`` / REST ``error.details`` list."""
    [ours] = [d for d in details if d.get("domain") == "a2agw.v1"]
    reason = ours["reason"]
    assert isinstance(reason, str)
    return reason


def carol_task(pki: Pki, url: str) -> str:
    """The id of a task carol (a peer of her own) leaves on the agent at ``url`` (JSON-RPC)."""
    params = {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "parts": [{"data": {"text": "carol's"}}],
            "metadata": {"a2agw.capability": "text.echo"},
        }
    }
    with httpx.Client(verify=client_context(pki, "carol"), timeout=20.0) as client:
        answer = client.post(
            url + JSONRPC_PATH, json=jsonrpc("SendMessage", params), headers=V1_HEADERS
        )
    task_id: str = answer.json()["result"]["task"]["id"]
    return task_id
