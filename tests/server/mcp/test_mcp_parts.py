"""Capabilities whose contracts declare parts and replies, behind the MCP door.

A ``tools/call``'s ``arguments`` are one JSON object: one data part. A
capability that takes no data part is no tool (not listed; a call naming it
is refused ``CONTENT_TYPE_NOT_SUPPORTED``, audited, nothing runs); replies
become content blocks; ``ctx.ask_input`` fails the call (MCP has no next
message to answer with).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations
from tests.helpers.mcp import sdk_client, serving_mcp


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, conversations: Conversations) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", CAPABILITIES)])
    config = serving_mcp(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in conversations.capabilities():
        registry.register(cap)
    agent = await started(config, registry)
    yield agent
    await agent.stop()


async def _records(agent: Agent) -> list[tuple[str, str, str, str]]:
    await agent.audit.flush()
    return [
        (r.peer_id, r.capability, r.decision, r.reason) for r in audit_rows(agent.config.audit_db)
    ]


async def test_a_capability_taking_no_data_part_is_no_tool(alice: Agent, pki: Pki) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert "doc.words" not in tools  # Accepts(data=False): text and files only
    assert "chat.reply" in tools and "trip.book" in tools
    assert tools["chat.reply"].output_schema is None  # it answers a Message, not its object
    assert await _records(alice) == []


async def test_calling_a_capability_taking_no_data_part_is_refused_and_audited(
    alice: Agent, pki: Pki, conversations: Conversations
) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        result = await client.call_tool("doc.words", {})
    assert result.is_error is True
    assert result.meta == {"a2agw/reason": "CONTENT_TYPE_NOT_SUPPORTED"}
    [block] = result.content
    assert block.text.startswith(  # type: ignore[union-attr]
        "CONTENT_TYPE_NOT_SUPPORTED: this capability takes no data part"
    )
    assert conversations.seen == []  # nothing ran
    assert await _records(alice) == [
        (spiffe("bob"), "doc.words", "refuse", "CONTENT_TYPE_NOT_SUPPORTED")
    ]


async def test_a_message_reply_answers_content_blocks(
    alice: Agent, pki: Pki, conversations: Conversations
) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        result = await client.call_tool("chat.reply", {"text": "bob"})
    assert result.is_error is False
    assert [(b.type, b.text) for b in result.content] == [  # type: ignore[union-attr]
        ("text", "hello bob")
    ]
    assert result.structured_content is None
    assert conversations.seen == [("chat.reply", "bob")]
    assert await _records(alice) == [(spiffe("bob"), "chat.reply", "allow", "OK")]


async def test_a_task_reply_of_every_part_kind_answers_one_block_each(
    alice: Agent, pki: Pki
) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        result = await client.call_tool("out.kinds", {"text": "all"})
    assert result.is_error is False
    content = [block.model_dump(exclude_none=True, by_alias=True) for block in result.content]
    assert [block["type"] for block in content] == [
        "text",  # the reply's final text
        "text",
        "resource",
        "resource_link",
        "text",
    ]
    assert content[0]["text"] == "four artifacts"
    assert content[1]["text"] == "Generated text content"
    resource = content[2]["resource"]
    assert base64.b64decode(resource["blob"]) == b"tck"
    assert (str(resource["uri"]), resource["mimeType"]) == ("a2agw:part/1/output.txt", "text/plain")
    assert str(content[3]["uri"]) == "https://example.com/output.txt"  # a link, never fetched
    assert content[4]["text"] == '{"key":"value","count":42}'
    assert result.structured_content == {"key": "value", "count": 42}  # its one data part


async def test_ask_input_fails_an_mcp_call(alice: Agent, pki: Pki) -> None:
    async with sdk_client(alice.mcp_url, pki, "bob") as client:
        result = await client.call_tool("trip.book", {"text": "go"})
    assert result.is_error is True
    assert result.meta == {"a2agw/reason": "CAPABILITY_FAILED"}
    assert await _records(alice) == [(spiffe("bob"), "trip.book", "allow", "CAPABILITY_FAILED")]
