"""The capabilities as MCP tools, called with the official MCP Python SDK client.

The SDK's client speaks the newest revision it shares with the server
(2026-07-28 here); every answer is checked by the SDK against that revision's
schema before the test sees it. Each decision is one audit record.
"""

from __future__ import annotations

import asyncio
import hashlib
from urllib.parse import urlsplit

import mcp_types as types
import pytest
from cryptography import x509
from mcp.shared.exceptions import MCPError

from capabilities.contract import Risk
from capabilities.versions import VersionConstraint
from gateway.runtime.agent import Agent
from gateway.server.mcp.tool_listing import tool_annotations
from policies.identity import svid_dns_name
from tests.integration.mcp.mcp_support import (
    MODERN,
    modern_call,
    raw_client,
    sdk_client,
    tls_context,
)
from tests.support import Pki, WriteCounter, audit_rows, spiffe
from tests.task_capabilities import TaskGate


async def _records(agent: Agent) -> list[tuple[str, str, str, str]]:
    await agent.audit.flush()
    return [
        (r.peer_id.rsplit("/", 1)[-1], r.capability, r.decision, r.reason)
        for r in audit_rows(agent.config.audit_db)
    ]


async def test_tools_list_shows_each_caller_what_its_grant_allows(alice: Agent, pki: Pki) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        assert client.protocol_version == MODERN
        bob_tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    async with sdk_client(alice.mcp_url, pki, "carol") as client:
        carol_tools = [tool.name for tool in (await client.list_tools()).tools]

    assert sorted(bob_tools) == [
        "job.linger",
        "job.run",
        "job.steps",
        "kv.get",
        "kv.put",
        "notes.write",
        "text.echo",
        "text.search",
    ]
    assert carol_tools == ["text.echo"]  # notes.write is a write: above her max_risk
    echo = alice.registry.resolve("text.echo", VersionConstraint.parse(""))
    assert echo is not None
    tool = bob_tools["text.echo"]
    assert tool.input_schema == echo.contract.input_schema()
    assert tool.output_schema == echo.contract.output_schema()
    assert tool.description == echo.contract.description
    assert tool.meta == {"a2agw/version": str(echo.version), "a2agw/risk": "read"}
    assert tool.annotations is not None
    assert tool.annotations.read_only_hint is True
    write = bob_tools["notes.write"].annotations
    assert write is not None
    assert (write.read_only_hint, write.destructive_hint, write.idempotent_hint) == (
        False,
        True,
        True,
    )
    assert await _records(alice) == []  # an allowed listing is no decision on a call


def test_annotations_follow_the_risk() -> None:
    assert tool_annotations(Risk.READ, idempotent=False) == {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    assert tool_annotations(Risk.WRITE, idempotent=False)["destructiveHint"] is True
    assert tool_annotations(Risk.EXTERNAL, idempotent=True) == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
        "openWorldHint": True,
    }


async def test_call_answers_structured_output_and_text_and_is_audited(
    alice: Agent, pki: Pki
) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        result = await client.call_tool("text.echo", {"text": "hello"})

    assert result.is_error is False
    assert result.structured_content == {"text": "hello"}
    assert [(block.type, block.text) for block in result.content] == [  # type: ignore[union-attr]
        ("text", '{"text":"hello"}')
    ]
    assert result.meta is not None
    assert result.meta["a2agw/version"] == "1.0.0"
    assert result.meta["a2agw/replayed"] is False
    evidence = hashlib.sha256(b'{"text":"hello"}').hexdigest()
    assert result.meta["a2agw/evidence_sha256"] == evidence
    await alice.audit.flush()
    [record] = audit_rows(alice.config.audit_db)
    assert (record.peer_id, record.capability, record.decision, record.reason) == (
        spiffe("bob"),
        "text.echo",
        "allow",
        "OK",
    )
    assert record.payload_sha256 == hashlib.sha256(b'{"text":"hello"}').hexdigest()
    assert record.request_id  # a fresh id: the JSON-RPC id is no request id


async def test_a_tool_the_caller_lacks_is_a_jsonrpc_error_with_the_reason(
    alice: Agent, pki: Pki
) -> None:
    async with sdk_client(alice.mcp_url, pki, "carol") as client:
        with pytest.raises(MCPError) as not_granted:
            await client.call_tool("kv.put", {"key": "k", "value": "v"})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no.such", {})

    for refused in (not_granted.value, unknown.value):
        assert refused.error.code == types.INVALID_PARAMS
        assert refused.error.message.startswith("CAPABILITY_NOT_GRANTED: ")
        assert refused.error.data == {"reason": "CAPABILITY_NOT_GRANTED", "domain": "a2agw.v1"}
    assert await _records(alice) == [
        ("carol", "kv.put", "refuse", "CAPABILITY_NOT_GRANTED"),
        ("carol", "no.such", "refuse", "CAPABILITY_NOT_GRANTED"),
    ]


async def test_policy_refusals_after_the_tool_is_known_are_tool_errors(
    alice: Agent, pki: Pki, counter: WriteCounter
) -> None:
    async with sdk_client(alice.mcp_url, pki, "carol") as client:
        risky = await client.call_tool("notes.write", {"note": "n"})
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        invalid = await client.call_tool("text.echo", {"txt": "hello", "secret": "x"})
        too_large = await client.call_tool("text.echo", {"text": "x" * 2000})

    answers = {"risk": risky, "invalid": invalid, "too large": too_large}
    reasons = {
        name: (r.is_error, (r.meta or {}).get("a2agw/reason")) for name, r in answers.items()
    }
    assert reasons == {
        "risk": (True, "RISK_NOT_GRANTED"),
        "invalid": (True, "INVALID_INPUT"),
        "too large": (True, "PAYLOAD_TOO_LARGE"),
    }
    text = invalid.content[0].text  # type: ignore[union-attr]
    assert text.startswith("INVALID_INPUT: ") and "secret" not in text  # never payload content
    assert counter.calls == 0
    assert await _records(alice) == [
        ("carol", "notes.write", "refuse", "RISK_NOT_GRANTED"),
        ("bob", "text.echo", "refuse", "INVALID_INPUT"),
        ("bob", "text.echo", "refuse", "PAYLOAD_TOO_LARGE"),
    ]


async def test_progress_reports_reach_the_client(alice: Agent, pki: Pki, gate: TaskGate) -> None:
    seen: list[tuple[float, str | None]] = []
    second = asyncio.Event()

    async def progress(value: float, _total: float | None, message: str | None) -> None:
        seen.append((value, message))
        if message == "step 2":
            second.set()

    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        call = asyncio.create_task(
            client.call_tool("job.steps", {"tag": "t"}, progress_callback=progress)
        )
        await asyncio.wait_for(gate.started.wait(), 10)
        gate.next_step.set()
        await asyncio.wait_for(second.wait(), 10)
        gate.release.set()
        result = await asyncio.wait_for(call, 10)

    assert seen == [(1, "step 1"), (2, "step 2")]
    assert result.structured_content == {"done": "t"}
    assert await _records(alice) == [("bob", "job.steps", "allow", "OK")]


async def test_a_client_that_abandons_its_call_cancels_it(
    alice: Agent, pki: Pki, gate: TaskGate
) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        call = asyncio.create_task(client.call_tool("job.linger", {"tag": "t"}))
        await asyncio.wait_for(gate.started.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(gate.cancelled.wait(), 10)
        gate.next_step.set()  # let the capability finish its clean-up
        after = await client.call_tool("text.echo", {"text": "still here"})

    assert after.structured_content == {"text": "still here"}
    for _ in range(100):
        if ("bob", "job.linger", "allow", "CANCELLED") in await _records(alice):
            break
        await asyncio.sleep(0.1)
    [cancelled] = [r for r in audit_rows(alice.config.audit_db) if r.capability == "job.linger"]
    assert (cancelled.decision, cancelled.reason) == ("allow", "CANCELLED")
    assert cancelled.detail == "cancelled: the MCP client closed the request"


async def test_no_certificate_unknown_peer_and_expired_grant_are_refused(
    alice: Agent, pki: Pki
) -> None:
    body, headers = modern_call("text.echo", {"text": "hi"})
    answers = {}
    for caller in (None, "mallory", "dave"):
        async with raw_client(pki, caller) as http:
            response = await http.post(alice.mcp_url, json=body, headers=headers)
        error = response.json()["error"]
        answers[caller] = (response.status_code, response.json()["id"], error["data"]["reason"])
        assert error["message"].startswith(error["data"]["reason"] + ": ")
        assert error["code"] == -32010
    assert answers == {
        None: (401, None, "UNAUTHENTICATED"),
        "mallory": (403, None, "UNKNOWN_PEER"),
        "dave": (403, None, "GRANT_EXPIRED"),
    }
    assert await _records(alice) == [
        ("", "", "refuse", "UNAUTHENTICATED"),
        ("mallory", "", "refuse", "UNKNOWN_PEER"),
        ("dave", "", "refuse", "GRANT_EXPIRED"),
    ]
    for caller in (None, "mallory"):  # the SDK's client cannot even connect
        with pytest.raises(Exception):  # noqa: B017 - the SDK's own connect error
            async with sdk_client(alice.mcp_url, pki, caller) as client:
                await client.list_tools()


async def _served_serial(pki: Pki, agent: Agent) -> int:
    """The serial of the certificate a new TLS handshake with the MCP port presents."""
    url = urlsplit(agent.mcp_url)
    _, writer = await asyncio.open_connection(
        url.hostname, url.port, ssl=tls_context(pki, "bob"), server_hostname="localhost"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_rotated_certificate_serves_the_next_handshake(alice: Agent, pki: Pki) -> None:
    old = await _served_serial(pki, alice)
    cert, key = pki.ca.mint(
        uris=[spiffe("alice")], dns_names=[svid_dns_name(spiffe("alice")), "localhost"]
    )
    alice.config.tls.key.write_bytes(key)  # type: ignore[union-attr]
    alice.config.tls.cert.write_bytes(cert)  # type: ignore[union-attr]
    alice.reload()  # what SIGHUP (or the file watcher) does
    new = x509.load_pem_x509_certificate(cert).serial_number
    assert new != old
    assert await _served_serial(pki, alice) == new
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        assert (await client.call_tool("text.echo", {"text": "x"})).is_error is False
