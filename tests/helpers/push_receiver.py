"""Push-notification test helpers: an HTTPS webhook on loopback with its own CA, and a resolver.

``WebhookReceiver`` is a real HTTPS server (uvicorn, Starlette) on 127.0.0.1:0
whose certificate, from a CA minted for it in the test, names the given DNS
names and 127.0.0.1. It records every request (path, headers, body) and
answers with ``status`` (and ``location`` for a redirect), after ``delay``
seconds. The agent trusts its CA through ``[push] ca``.

``ScriptedResolver`` is the resolver seam of deliveries: each name answers
the next of its scripted answers (the last one again once they run out), and
every lookup is counted.

``webhook`` and ``pushed`` put a webhook config on a SendMessage; ``attempts`` waits for
the agent's delivery records.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from a2a.types import a2a_pb2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.audit import AuditRecord
from gateway.config import AgentConfig, PushSettings
from gateway.push.signature import SIGNATURE_HEADER, verify_notification
from gateway.runtime.agent import Agent
from tests.helpers.agents import audit_rows


@dataclass(frozen=True)
class Delivered:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes

    def event(self) -> a2a_pb2.StreamResponse:
        """The body as the ``StreamResponse`` it must be."""
        return json_format.Parse(self.body, a2a_pb2.StreamResponse())

    def verified(self, ca_pem: bytes, agent_id: str, url: str) -> dict[str, Any]:
        """The JWS header, once the signature checks out (raises otherwise)."""
        return verify_notification(
            self.body, self.headers[SIGNATURE_HEADER.lower()], ca_pem, agent_id, url=url
        )


def mint_tls(directory: Path, names: Sequence[str]) -> tuple[Path, Path, Path]:
    """A fresh CA and a server certificate for ``names`` and 127.0.0.1: (ca, cert, key) files."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@dataclass
class WebhookReceiver:
    """An HTTPS webhook on 127.0.0.1 (see the module doc)."""

    directory: Path
    names: Sequence[str] = ("receiver.test",)
    status: int = 200
    location: str = ""
    delay: float = 0.0
    received: list[Delivered] = field(default_factory=list)
    port: int = 0
    ca: Path = Path()
    _server: uvicorn.Server | None = None
    _serving: asyncio.Task[None] | None = None
    _sock: socket.socket | None = None

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        """The webhook URL at ``host`` (a name the certificate holds, or 127.0.0.1)."""
        return f"https://{host}:{self.port}{path}"

    async def _answer(self, request: Request) -> Response:
        body = await request.body()
        headers = {name.lower(): value for name, value in request.headers.items()}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        self.received.append(Delivered(path, headers, body))
        if self.delay:
            await asyncio.sleep(self.delay)
        extra = {"Location": self.location} if self.location else {}
        return Response(b"", status_code=self.status, headers=extra)

    async def wait(self, count: int, timeout: float = 20.0) -> list[Delivered]:
        """The first ``count`` requests, once they came (bounded wait)."""
        for _ in range(int(timeout / 0.02)):
            if len(self.received) >= count:
                return self.received[:count]
            await asyncio.sleep(0.02)
        raise AssertionError(f"the webhook got {len(self.received)} requests, not {count}")

    async def __aenter__(self) -> WebhookReceiver:
        ca, cert, key = mint_tls(self.directory, self.names)
        self.ca = ca
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._sock, self.port = sock, sock.getsockname()[1]
        app = Starlette(routes=[Route("/{path:path}", self._answer, methods=["POST"])])
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_config=None,
                log_level="warning",
                lifespan="off",
                ssl_certfile=str(cert),
                ssl_keyfile=str(key),
            )
        )
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]))
        for _ in range(400):  # bounded: up to ~20 s on a busy runner
            if self._server.started or self._serving.done():
                break
            await asyncio.sleep(0.05)
        assert self._server.started, "the webhook receiver did not start"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._serving is not None and self._sock is not None
        self._server.should_exit = True
        await self._serving
        self._sock.close()


@dataclass
class ScriptedResolver:
    """Answers each name with its next scripted answer; counts the lookups."""

    answers: dict[str, list[list[str]]]
    lookups: list[str] = field(default_factory=list)

    async def __call__(self, name: str, port: int) -> list[str]:
        self.lookups.append(name)
        script = self.answers.get(name)
        if not script:
            raise OSError(f"{name}: no such name")
        return script.pop(0) if len(script) > 1 else script[0]


def with_push(config: AgentConfig, ca: Path | None = None, **settings: Any) -> AgentConfig:
    """``config`` with ``[push]`` enabled, trusting ``ca`` for webhooks."""
    push = PushSettings.model_validate({"enabled": True, "ca": ca, **settings})
    return config.model_copy(update={"push": push})


def webhook(
    url: str, config_id: str = "hook-1", **fields: Any
) -> a2a_pb2.TaskPushNotificationConfig:
    """A webhook config for ``url`` with a token and Bearer credentials."""
    return a2a_pb2.TaskPushNotificationConfig(
        id=config_id,
        url=url,
        token="tok-123",
        authentication=a2a_pb2.AuthenticationInfo(scheme="Bearer", credentials="secret-456"),
        **fields,
    )


def pushed(
    request: a2a_pb2.SendMessageRequest, config: a2a_pb2.TaskPushNotificationConfig
) -> a2a_pb2.SendMessageRequest:
    """``request`` asking for push notifications to ``config``."""
    request.configuration.task_push_notification_config.CopyFrom(config)
    return request


def push_records(rows: list[AuditRecord]) -> list[AuditRecord]:
    """The delivery records among ``rows``."""
    return [r for r in rows if r.detail.startswith("A2A push")]


async def attempts(agent: Agent, count: int) -> list[AuditRecord]:
    """The first ``count`` delivery records, once they are in the log (bounded wait)."""
    for _ in range(1000):
        await agent.audit.flush()
        found = push_records(audit_rows(agent.config.audit_db))
        if len(found) >= count:
            return found[:count]
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {count} delivery records")
