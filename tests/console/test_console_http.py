"""The console listener over plain HTTP and mTLS: headers, escaping, read-only, operators."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sqlite3
import ssl
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.audit.record import AuditRecord
from gateway.client.peer_client import PeerClient
from gateway.config import ConsoleSettings
from gateway.console.pages import esc
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from tests.support import Pki, agent_config, grant, spiffe, started, write_policy


async def _exchange(
    address: str, request: str, tls: ssl.SSLContext | None = None
) -> tuple[str, dict[str, str], str]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=tls)
    writer.write(request.encode())
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(), 10)).decode()
    writer.close()
    head, _, body = answer.partition("\r\n\r\n")
    status, *lines = head.split("\r\n")
    headers = {name.title(): value for name, value in (line.split(": ", 1) for line in lines)}
    return status, headers, body


async def _get(
    address: str, path: str, tls: ssl.SSLContext | None = None
) -> tuple[str, dict[str, str], str]:
    return await _exchange(address, f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n", tls)


async def _agent(
    pki: Pki, tmp_path: Path, settings: ConsoleSettings, stores: dict[str, str] | None = None
) -> Agent:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy, stores=stores)
    return await started(config.model_copy(update={"console": settings}))


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"listen": "0.0.0.0:9465"}, "not a loopback address"),
        ({"listen": "127.0.0.1:9465", "allow_remote": True}, "needs console.operators"),
        (
            {"listen": "127.0.0.1:9465", "operators": ["spiffe://example.org/agent/op"]},
            "only apply with console.allow_remote",
        ),
        ({"listen": "127.0.0.1"}, "expected host:port"),
    ],
)
def test_console_settings_fail_closed(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ConsoleSettings.model_validate(settings)


async def test_console_is_off_without_its_section(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [])
    agent = await started(agent_config(pki, tmp_path, "alice", policy))
    try:
        assert agent.console is None
    finally:
        await agent.stop()


async def test_pages_carry_strict_headers_and_escape_what_they_reflect(
    console_agent: Agent,
) -> None:
    console = console_agent.console
    assert console is not None
    for path in ("/", "/refusals", "/grants", "/certificate", "/upstreams", "/audit", "/tasks"):
        status, headers, body = await _get(console.address, path)
        assert status == "HTTP/1.1 200 OK", path
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["Content-Security-Policy"].startswith(
            "default-src 'self'; script-src 'self'"
        )
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "http://" not in body and "https://" not in body.replace(
            'xmlns="http://www.w3.org/2000/svg"', ""
        )  # nothing fetched from elsewhere
    status, _, body = await _get(console.address, '/?peer="><script>alert(1)</script>&since=soon')
    assert status == "HTTP/1.1 200 OK"
    assert "<script>alert" not in body
    assert 'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in body
    assert "--since &#x27;soon&#x27;: expected a positive number" in body
    for method in ("POST", "DELETE"):
        answer = await _exchange(console.address, f"{method} / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert answer[0] == "HTTP/1.1 405 Method Not Allowed"
    assert (await _get(console.address, "/static/../config.py"))[0] == "HTTP/1.1 404 Not Found"
    status, headers, script = await _get(console.address, "/static/console.js")
    assert status == "HTTP/1.1 200 OK" and "textContent" in script and "innerHTML" not in script
    status, headers, body = await _get(console.address, "/readyz")
    assert (status, headers["Content-Type"], body) == (
        "HTTP/1.1 200 OK",
        "text/plain; charset=utf-8",
        "SERVING\n",
    )


async def test_events_stream_only_the_records_that_pass_the_filters(
    pki: Pki, tmp_path: Path, stores: dict[str, str]
) -> None:
    console_agent = await _agent(pki, tmp_path, ConsoleSettings(listen="127.0.0.1:0"), stores)
    try:
        await _one_refusal_streamed(console_agent, pki)
    finally:
        await console_agent.stop()


async def _one_refusal_streamed(console_agent: Agent, pki: Pki) -> None:
    console = console_agent.console
    assert console is not None
    host, port = console.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /events?reason=capability_not_granted HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b": connected\n\n"), 10)
    assert b"content-type: text/event-stream" in head.lower()
    try:
        async with PeerClient(
            console_agent.config.id, console_agent.address, pki.material("bob")
        ) as bob:
            await bob.invoke("text.echo", {"text": "secret"})
            with pytest.raises(GatewayError):
                await bob.invoke("kv.get", {"key": "k"})
        event = await asyncio.wait_for(reader.readuntil(b"\n\n"), 20)
    finally:
        writer.close()
    fields = (line for line in event.decode().strip().split("\n") if ": " in line)  # no chunk sizes
    lines = dict(line.split(": ", 1) for line in fields)
    assert lines["event"] == "decision"
    data = json.loads(lines["data"])
    assert (data["capability"], data["reason"], data["peer"]) == (
        "kv.get",
        "CAPABILITY_NOT_GRANTED",
        spiffe("bob"),
    )
    assert lines["id"] == str(data["seq"]) and "secret" not in event.decode()


async def _status_or_failure(address: str, tls: ssl.SSLContext | None) -> str:
    try:
        status = (await _get(address, "/grants", tls))[0]
    except (ssl.SSLError, ConnectionError, OSError, asyncio.IncompleteReadError):
        return "no answer"
    return status or "no answer"


def _client_tls(pki: Pki, name: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    context.check_hostname = False  # the agent's certificate names a SPIFFE ID, not a host
    if name is not None:
        context.load_cert_chain(str(pki.dir / f"{name}.pem"), str(pki.dir / f"{name}.key"))
    return context


async def test_remote_console_admits_only_listed_operators(pki: Pki, tmp_path: Path) -> None:
    settings = ConsoleSettings(
        listen="127.0.0.1:0", allow_remote=True, operators=(spiffe("carol"),)
    )
    agent = await _agent(pki, tmp_path, settings)
    try:
        console = agent.console
        assert console is not None and console.url.startswith("https://")
        status, _, body = await _get(console.address, "/grants", _client_tls(pki, "carol"))
        assert status == "HTTP/1.1 200 OK" and spiffe("bob") in body
        status, _, body = await _get(console.address, "/grants", _client_tls(pki, "bob"))
        assert status == "HTTP/1.1 403 Forbidden" and spiffe("bob") not in body
        for tls in (_client_tls(pki, None), None):  # no client certificate; no TLS at all
            assert await _status_or_failure(console.address, tls) == "no answer"
    finally:
        await agent.stop()


async def test_audit_and_in_flight_pages_tell_the_truth(console_agent: Agent, pki: Pki) -> None:
    console = console_agent.console
    assert console is not None
    async with PeerClient(
        console_agent.config.id, console_agent.address, pki.material("bob")
    ) as bob:
        await bob.invoke("text.echo", {"text": "x"})
        with pytest.raises(GatewayError):
            await bob.invoke("kv.get", {"key": "k"})
    await console_agent.audit.flush()
    _, _, body = await _get(console.address, "/audit?verify=1")
    assert "<dt>Records</dt><dd>2</dd>" in body
    assert "<dt>Chain check</dt><dd>intact (2 records)</dd>" in body
    assert "<dt>Health</dt><dd>SERVING</dd>" in body
    _, _, body = await _get(console.address, "/tasks")
    assert "<dt>Running now</dt><dd>0</dd>" in body
    assert "<dt>Server-wide cap</dt><dd>256</dd>" in body
    _, _, body = await _get(console.address, "/upstreams")
    assert "This agent fronts no upstream A2A agents." in body
    _, _, body = await _get(console.address, f"/?peer={spiffe('bob')}&reason=OK")
    assert body.count("<tr><td>") == 1 and "text.echo" in body and "kv.get" not in body


async def test_live_pages_are_capped(console_agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.console import server

    monkeypatch.setattr(server, "MAX_STREAMS", 1)
    console = console_agent.console
    assert console is not None
    host, port = console.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    try:
        await asyncio.wait_for(reader.readuntil(b": connected\n\n"), 10)
        status, _, body = await _get(console.address, "/events")
        assert (status, body) == ("HTTP/1.1 503 Service Unavailable", "too many live pages\n")
    finally:
        writer.close()


def _errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


async def _one_allowed_one_refused(agent: Agent, pki: Pki) -> None:
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
        await bob.invoke("text.echo", {"text": "x"})
        with pytest.raises(GatewayError):
            await bob.invoke("kv.get", {"key": "k"})
    await agent.audit.flush()


async def test_a_since_too_far_back_is_named_on_the_page(
    console_agent: Agent, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    console = console_agent.console
    assert console is not None
    await _one_allowed_one_refused(console_agent, pki)  # the chart has a refusal to place
    for path, since in (
        ("/", "1000000000d"),
        ("/", "99999999999d"),
        ("/refusals", "999999999d"),
        ("/refusals", "99999999999999999999999s"),
    ):
        status, _, body = await _get(console.address, f"{path}?since={since}")
        assert status == "HTTP/1.1 200 OK", (path, since)
        assert (
            f'<p class="problem">--since &#x27;{since}&#x27;: too far back '
            "(it reaches before the year 1)</p>"
        ) in body
    assert _errors_logged(caplog) == []


async def test_too_many_query_parameters_are_a_bad_request(
    console_agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    console = console_agent.console
    assert console is not None
    twenty = "&".join(f"p{n}={n}" for n in range(20))
    assert (await _get(console.address, f"/?{twenty}"))[0] == "HTTP/1.1 200 OK"
    status, _, body = await _get(console.address, f"/?{twenty}&p20=20")
    assert (status, body) == ("HTTP/1.1 400 Bad Request", "")
    assert _errors_logged(caplog) == []


async def _open_live_page(
    address: str, sock: socket.socket | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    if sock is None:
        reader, writer = await asyncio.open_connection(host, int(port))
    else:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b": connected\n\n"), 10)
    return reader, writer


async def _live_page_status(address: str, attempts: int = 100) -> str:
    """The first answer to a new live page that is not 503 (bounded: ``attempts`` tries)."""
    host, port = address.rsplit(":", 1)
    status = ""
    for _ in range(attempts):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        status = (await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)).decode().strip()
        writer.close()
        if status != "HTTP/1.1 503 Service Unavailable":
            break
        await asyncio.sleep(0.1)
    return status


async def test_a_closed_live_page_frees_its_slot_at_once(
    console_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.console import server

    monkeypatch.setattr(server, "MAX_STREAMS", 1)
    monkeypatch.setattr(server, "KEEPALIVE_SECONDS", 3600.0)  # no write will find it gone
    console = console_agent.console
    assert console is not None
    _, writer = await _open_live_page(console.address)
    writer.close()
    await writer.wait_closed()
    assert await _live_page_status(console.address) == "HTTP/1.1 200 OK"


def _bulky(n: int) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"{n}-" + "r" * 100_000,  # 100 kB of event each
        peer_id=spiffe("bob"),
        capability="text.echo",
        version_constraint="",
        served_version="1.0.0",
        decision="allow",
        reason="OK",
        payload_size=1,
        payload_sha256="0" * 64,
        latency_ms=1.0,
    )


async def test_a_live_page_that_stops_reading_is_dropped(
    console_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.console import http, server

    monkeypatch.setattr(server, "MAX_STREAMS", 1)
    monkeypatch.setattr(http, "DRAIN_TIMEOUT", 0.5, raising=False)
    console = console_agent.console
    assert console is not None
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    _, writer = await _open_live_page(console.address, stalled)
    try:
        for n in range(100):  # 10 MB of events it never reads, socket open
            console_agent.audit.record(_bulky(n))
        await console_agent.audit.flush()
        assert await _live_page_status(console.address) == "HTTP/1.1 200 OK"
    finally:
        writer.close()


async def test_altered_audit_files_are_named_on_the_pages(
    console_agent: Agent, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    console = console_agent.console
    assert console is not None
    config = console_agent.config
    await _one_allowed_one_refused(console_agent, pki)
    with config.checkpoint_file.open("a") as file:
        file.write('{"seq": 1e999, "time_unix_ms": 1}\n')
    status, _, body = await _get(console.address, "/audit")
    assert status == "HTTP/1.1 200 OK"
    assert "<dt>Records</dt><dd>2</dd>" in body
    checkpoint = (
        f"checkpoint file {config.checkpoint_file}: its last checkpoint cannot be read (seq or "
        "time_unix_ms is not a whole number in range); check the file with: "
        "a2a-gateway audit verify --config AGENT.toml"
    )
    assert f'<dt>Last checkpoint</dt><dd><p class="problem">{esc(checkpoint)}</p></dd>' in body

    conn = sqlite3.connect(config.audit_db)
    conn.execute("UPDATE audit_records SET time_unix_ms = 99999999999999999 WHERE seq = 2")
    conn.commit()
    conn.close()
    record = (
        f"audit log {config.audit_db}: holds a record that cannot be read (seq 2: time_unix_ms "
        "99999999999999999 is out of range); check the log with: "
        f"a2a-gateway audit verify --db {config.audit_db}"
    )
    for path in ("/", "/refusals", "/audit"):
        status, _, body = await _get(console.address, path)
        assert status == "HTTP/1.1 200 OK", path
        assert f'<p class="problem">{esc(record)}</p>' in body, path
    assert _errors_logged(caplog) == []
