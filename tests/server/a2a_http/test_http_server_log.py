"""The HTTPS server's own log lines and its shutdown, as an operator sees them.

Found after the last stop: uvicorn configured its own loggers (a stderr
handler of its own, not propagating), so its lines bypassed the process's
handler: with ``--log-format json`` a line such as "Invalid HTTP request
received." came out as uvicorn's plain text among the JSON objects, and a
traceback of its would have been printed in full. And an agent stopping while
a client held an idle keep-alive connection that never answered TLS
close_notify waited out its whole grace period for that connection, then
logged "Cancel 0 running task(s), timeout graceful shutdown exceeded" at ERROR.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.telemetry.json_logs import JsonFormatter
from tests.helpers.a2a_http import (
    V1_HEADERS,
    client_context,
    jsonrpc,
    message_params,
    serving_https,
)
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)


class ProcessLog(logging.Handler):
    """What ``a2a-gateway serve``'s root handler writes: one JSON object per record."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.events: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(json.loads(self.format(record)))


@pytest.fixture
def process_log() -> Iterator[ProcessLog]:
    handler = ProcessLog()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def https_port(agent: Agent) -> int:
    return int(agent.https_url.rsplit(":", 1)[1])


def tls_socket(pki: Pki, agent: Agent) -> ssl.SSLSocket:
    """A blocking TLS connection as bob: it answers nothing unless asked to read."""
    raw = socket.create_connection(("localhost", https_port(agent)), timeout=10)
    return client_context(pki, "bob").wrap_socket(raw, server_hostname="localhost")


def uvicorn_stream_handlers() -> list[logging.Handler]:
    """Handlers uvicorn put on its loggers (pytest's capture handlers are not streams)."""
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    return [h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler]


async def test_the_https_servers_lines_reach_the_process_log_as_its_own_format(
    pki: Pki, alice: Agent, process_log: ProcessLog
) -> None:
    def invalid_request() -> bytes:
        with tls_socket(pki, alice) as conn:
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            return conn.recv(65536)

    answer = await asyncio.to_thread(invalid_request)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert uvicorn_stream_handlers() == []  # none of uvicorn's own beside the process's
    lines = [e for e in process_log.events if str(e["logger"]).startswith("uvicorn")]
    assert [(e["logger"], e["level"], e["event"]) for e in lines] == [
        ("uvicorn.error", "WARNING", "Invalid HTTP request received.")
    ]


async def test_an_idle_client_that_never_answers_close_notify_does_not_hold_the_stop(
    pki: Pki, tmp_path: Path, counter: WriteCounter, process_log: ProcessLog
) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    body = json.dumps(jsonrpc("SendMessage", message_params("text.echo", {"text": "hi"}))).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in V1_HEADERS.items())
    request = (
        f"POST {JSONRPC_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    def one_call(conn: ssl.SSLSocket) -> bytes:
        conn.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += conn.recv(65536)
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            body += conn.recv(65536)
        return head

    conn = await asyncio.to_thread(tls_socket, pki, agent)
    try:
        answer = await asyncio.to_thread(one_call, conn)
        assert answer.startswith(b"HTTP/1.1 200 ")
        # The connection stays idle in its keep-alive; this client reads no more,
        # so the server's close_notify is never answered.
        await agent.stop(grace=2.0)

        def after_stop() -> bytes:
            try:
                return conn.recv(65536)
            except (ConnectionError, ssl.SSLError):
                return b""

        assert await asyncio.to_thread(after_stop) == b""  # the server dropped it
    finally:
        conn.close()
    errors = [e for e in process_log.events if e["level"] in ("ERROR", "CRITICAL")]
    assert errors == []
