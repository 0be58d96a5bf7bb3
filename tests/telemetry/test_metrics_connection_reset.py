"""Probe: a scraper (or any local process) that resets its connection is no rendering failure.

The /metrics listener caught only timeouts and short reads around reading the
request; a connection reset fell through to ``except Exception`` and was logged
at ERROR, with a traceback, as ``metrics: rendering failed`` (nothing had been
rendered). Any local process could fill the agent's error log with it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from pathlib import Path

import pytest

from gateway.config import MetricsSettings
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    write_policy,
)


async def _reset_after(address: str, sent: bytes) -> None:
    host, port = address.rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(sent)
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    writer.transport.abort()


async def _get(address: str, path: str) -> str:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(), 10)).decode()
    writer.close()
    return answer.split("\r\n", 1)[0]


async def test_a_reset_connection_logs_no_error(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    settings = MetricsSettings(listen="127.0.0.1:0")
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(update={"metrics": settings})
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    try:
        address = agent.telemetry.metrics_address
        assert address is not None
        caplog.set_level(logging.INFO, logger="gateway.telemetry.metrics_server")
        for sent in (b"GET /metr", b"GET /metrics HTTP/1.1\r\nHost: x"):
            await _reset_after(address, sent)
        await asyncio.sleep(0.5)  # the server has seen both resets
        assert await _get(address, "/metrics") == "HTTP/1.1 200 OK"
        logged = [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if r.name == "gateway.telemetry.metrics_server" and r.levelno >= logging.WARNING
        ]
        assert logged == []
    finally:
        await agent.stop()
