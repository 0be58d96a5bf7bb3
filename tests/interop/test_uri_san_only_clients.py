"""Every client we test, against an agent whose SVID carries only its SPIFFE ID.

erin serves gRPC and HTTPS with an SVID holding one URI SAN and no DNS name at
all (what a SPIRE registration without ``-dns`` gives), on ``localhost``. Each
client pins the URI SAN instead of a host name, as docs/other-languages.md
says: it verifies the chain to the CA and requires the one URI SAN to be the
SPIFFE ID it wants, and no host name is checked. Each is also pinned once to
another SPIFFE ID of the same CA (carol), and must then refuse erin in the
handshake: nothing reaches erin's pipeline (no audit record).

- Node: @grpc/grpc-js (``node/client.js``, both services) and @a2a-js/sdk
  (``node-a2a/uri_pinned.mjs``: JSON-RPC, HTTP+JSON, gRPC);
- Go: a2a-go v0.3.3 (``go/main.go``, JSON-RPC);
- Java: the A2A Java SDK 0.3.0.Final (``java``) and 1.0.0.Alpha3 (``java1``),
  JSON-RPC and HTTP+JSON;
- Python: a2a-sdk over JSON-RPC with ``pinned_context`` as its TLS context,
  and over gRPC through ``SpiffeRelay`` (gRPC Python verifies only host names).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory, minimal_agent_card
from a2a.types import Message, Part, Role, SendMessageRequest, a2a_pb2
from a2a.utils.constants import TransportProtocol
from google.protobuf import json_format, struct_pb2
from grpc import aio

from gateway.client.pinned_tls import pinned_context
from gateway.client.spiffe_relay import SpiffeRelay
from gateway.config import TlsFiles
from gateway.devtools.pki import issue
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.transport.tls import relay_channel_options
from gateway.wire.v1 import gateway_pb2
from tests.a2a_http_support import V1_HEADERS
from tests.interop.node_projects import A2A_JS, GRPC_JS, node_ready
from tests.interop.served_agent import java_classpath, pkcs12_of
from tests.interop.test_a2a_0_3_clients import GO_DIR, JAVA_DIR, go_client
from tests.interop.test_node_client import _descriptor_set
from tests.support import Pki, agent_config, audit_rows, grant, spiffe, started, write_policy

ERIN, BOB, CAROL = spiffe("erin"), spiffe("bob"), spiffe("carol")
JAVA1_DIR = GO_DIR.parent / "java1"
GRANTED = ["text.echo", "text.search"]


@pytest.fixture
async def erin(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    """erin on gRPC and HTTPS (localhost), her SVID only her URI SAN."""
    if not (pki.dir / "erin.pem").exists():
        issue(pki.dir, "erin", uri_san_only=True)
    policy = write_policy(tmp_path / "erin-policy.toml", [grant("bob", GRANTED)])
    config = agent_config(pki, tmp_path, "erin", policy)
    config = config.model_copy(
        update={"a2a": config.a2a.model_copy(update={"http_listen": "localhost:0"})}
    )
    agent = await started(config)
    yield agent
    await agent.stop()


async def allowed(agent: Agent) -> Counter[tuple[str, str, str]]:
    """(peer, capability, decision) of every record so far: only bob's allowed calls."""
    await agent.audit.flush()
    return Counter((r.peer_id, r.capability, r.decision) for r in audit_rows(agent.config.audit_db))


async def run(*command: str, cwd: Path | None = None, timeout: float = 300) -> str:
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode == 0, (out.decode()[-2000:], err.decode()[-3000:])
    return out.decode()


def client_files(pki: Pki) -> dict[str, str]:
    return {
        "ca": str(pki.dir / "ca.pem"),
        "cert": str(pki.dir / "bob.pem"),
        "key": str(pki.dir / "bob.key"),
    }


async def test_node_grpc_js_pins_the_uri_san(pki: Pki, erin: Agent, tmp_path: Path) -> None:
    node_ready(GRPC_JS, "@grpc/grpc-js")
    config = tmp_path / "node.json"
    config.write_text(
        json.dumps(
            {
                "address": erin.address,
                **client_files(pki),
                "server_id": ERIN,
                "wrong_server_id": CAROL,
                "refused_capability": "notes.delete",
                "pin_uri_only": True,
                "gateway_descriptor_set": str(
                    _descriptor_set(gateway_pb2.DESCRIPTOR, tmp_path / "gateway.pb")
                ),
                "a2a_descriptor_set": str(_descriptor_set(a2a_pb2.DESCRIPTOR, tmp_path / "a2a.pb")),
            }
        )
    )
    answered = json.loads(await run("node", str(GRPC_JS / "client.js"), str(config)))
    assert answered["describe"] == GRANTED
    assert answered["invoke"] == {"served_version": "1.0.0", "payload": '{"text":"from node"}'}
    assert answered["refused"]["reasons"] == [
        {"domain": "a2agw.v1", "reason": "CAPABILITY_NOT_GRANTED"}
    ]
    assert answered["wrong_identity"] == "UNAVAILABLE"  # carol's pin refused erin's handshake
    assert answered["send_message"]["output"] == {"text": "a2a from node"}
    records = await allowed(erin)
    assert records == Counter({(BOB, "text.echo", "allow"): 2, (BOB, "notes.delete", "refuse"): 1})


async def test_the_javascript_sdk_pins_the_uri_san_on_three_bindings(
    pki: Pki, erin: Agent, tmp_path: Path
) -> None:
    node_ready(A2A_JS, "@a2a-js/sdk")
    config = tmp_path / "uri-pinned.json"
    config.write_text(
        json.dumps(
            {
                "https_url": erin.https_url,
                "server_id": ERIN,
                "wrong_server_id": CAROL,
                **client_files(pki),
            }
        )
    )
    answer = json.loads(await run("node", str(A2A_JS / "uri_pinned.mjs"), str(config), cwd=A2A_JS))
    for binding in ("JSONRPC", "HTTP+JSON", "GRPC"):
        assert answer[binding]["right"] == {"output": {"text": f"over {binding}"}}, answer
        assert "server is not " + CAROL in answer[binding]["wrong"]["error"], answer
    assert await allowed(erin) == Counter({(BOB, "text.echo", "allow"): 3})


async def test_a2a_go_pins_the_uri_san(pki: Pki, erin: Agent, tmp_path: Path) -> None:
    binary = await asyncio.to_thread(go_client)
    config = tmp_path / "go-client.json"
    config.write_text(
        json.dumps(
            {
                "base_url": erin.https_url,
                **client_files(pki),
                "pin_server_id": ERIN,
                "wrong_server_id": CAROL,
            }
        )
    )
    steps = [json.loads(line) for line in (await run(str(binary), str(config))).splitlines()]
    answer = {step.pop("step"): step for step in steps}
    assert answer["send_data"]["output"] == {"text": "hello"}
    assert "server is not " + CAROL in answer["wrong_identity"]["error"]
    assert await allowed(erin) == Counter({(BOB, "text.echo", "allow"): 1})


def java_config(pki: Pki, erin: Agent, tmp_path: Path, **more: Any) -> Path:
    config = tmp_path / "java-client.json"
    config.write_text(
        json.dumps(
            {
                "base_url": erin.https_url,
                **client_files(pki),
                "p12": str(pkcs12_of(pki, "bob", tmp_path / "bob.p12", b"interop")),
                "p12_password": "interop",
                "pin_server_id": ERIN,
                "wrong_server_id": CAROL,
                **more,
            }
        )
    )
    return config


def java_answers(out: str) -> dict[tuple[str, str], dict[str, Any]]:
    answers = {}
    for line in out.splitlines():
        if line.startswith("{"):
            step = json.loads(line)
            answers[(step.pop("binding", ""), step.pop("step"))] = step
    return answers


async def test_the_java_sdk_0_3_pins_the_uri_san(pki: Pki, erin: Agent, tmp_path: Path) -> None:
    classpath = await asyncio.to_thread(java_classpath, JAVA_DIR, "interop-java")
    config = java_config(pki, erin, tmp_path)
    out = await run("java", "-cp", classpath, str(JAVA_DIR / "A2AClient.java"), str(config))
    answer = java_answers(out)
    assert answer[("", "send_data")]["output"] == {"text": "hello"}, answer
    assert "server is not " + CAROL in answer[("", "wrong_identity")]["error"], answer
    assert await allowed(erin) == Counter({(BOB, "text.echo", "allow"): 1})


async def test_the_java_sdk_1_0_pins_the_uri_san(pki: Pki, erin: Agent, tmp_path: Path) -> None:
    classpath = await asyncio.to_thread(java_classpath, JAVA1_DIR, "interop-java1")
    config = java_config(pki, erin, tmp_path, bindings=["JSONRPC", "HTTP+JSON"], no_cert=False)
    out = await run("java", "-cp", classpath, str(JAVA1_DIR / "A2AClient.java"), str(config))
    answer = java_answers(out)
    for binding in ("JSONRPC", "HTTP+JSON"):
        assert answer[(binding, "send_data")]["output"] == {"text": "hello"}, answer
        assert "server is not " + CAROL in answer[(binding, "wrong_identity")]["error"], answer
    assert await allowed(erin) == Counter({(BOB, "text.echo", "allow"): 2})


def message(text: str) -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(data=json_format.ParseDict({"text": text}, struct_pb2.Value()))],
        metadata={"a2agw.capability": "text.echo"},
    )


async def test_the_python_sdk_pins_the_uri_san_over_jsonrpc_and_grpc(pki: Pki, erin: Agent) -> None:
    bob = pki.material("bob")
    files = TlsFiles(ca=pki.dir / "ca.pem", cert=pki.dir / "bob.pem", key=pki.dir / "bob.key")
    outputs = []
    async with httpx.AsyncClient(
        verify=pinned_context(bob, ERIN, files), headers=V1_HEADERS
    ) as web:
        config = ClientConfig(
            streaming=False,
            supported_protocol_bindings=[TransportProtocol.JSONRPC],
            httpx_client=web,
        )
        url = erin.https_url + JSONRPC_PATH
        client = ClientFactory(config).create(minimal_agent_card(url, [TransportProtocol.JSONRPC]))
        async for event in client.send_message(SendMessageRequest(message=message("jsonrpc"))):
            outputs.append(json_format.MessageToDict(event.task.artifacts[0].parts[0].data))
        async with httpx.AsyncClient(verify=pinned_context(bob, CAROL, files)) as wrong:
            with pytest.raises(httpx.ConnectError, match=f"is {ERIN}, not {CAROL}"):
                await wrong.post(url, json={})
    relay = SpiffeRelay(erin.address, pinned_context(bob, ERIN, files, alpn=["h2"]))
    channel = aio.insecure_channel(await relay.start(), options=relay_channel_options(ERIN))
    try:
        config = ClientConfig(
            streaming=False,
            supported_protocol_bindings=[TransportProtocol.GRPC],
            grpc_channel_factory=lambda _url: channel,
        )
        client = ClientFactory(config).create(
            minimal_agent_card(erin.address, [TransportProtocol.GRPC])
        )
        async for event in client.send_message(SendMessageRequest(message=message("grpc"))):
            outputs.append(json_format.MessageToDict(event.task.artifacts[0].parts[0].data))
        await client.close()
    finally:
        await relay.close()
    assert outputs == [{"text": "jsonrpc"}, {"text": "grpc"}]
    assert await allowed(erin) == Counter({(BOB, "text.echo", "allow"): 2})
