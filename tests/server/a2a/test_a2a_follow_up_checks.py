"""A follow-up message passes every check a first message does, and a URL part is never fetched.

Each refused follow-up: its exact reason, one audit record on the task, the task still
waiting, the capability not resumed. A URL part reaches the capability as its URL;
nothing dials it, and the audit log holds no part of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.client.errors import A2AClientError
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors

from capabilities import Accepts, CallContext, ContractModel, Gives, TaskReply, UrlPart, capability
from capabilities.parts import Artifact, TextPart
from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversations import ask_trip, message, records, texts
from tests.helpers.a2a_grpc import A2APeer, gateway_reason
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations

BOB = spiffe("bob")


class Link(ContractModel):
    text: str


async def start_alice(
    pki: Pki, tmp_path: Path, conversations: Conversations, **limits: Any
) -> Agent:
    names = [*CAPABILITIES, "link.take"]
    policy = write_policy(
        tmp_path / "alice-policy.toml", [{**grant("bob", names, max_payload_bytes=512), **limits}]
    )
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in conversations.capabilities():
        registry.register(cap)

    @capability(
        "link.take",
        "1.0.0",
        risk="read",
        timeout=5.0,
        accepts=Accepts(text=True, urls=True, max_parts=2),
        gives=Gives(text=True),
    )
    async def take(inp: Link, ctx: CallContext) -> TaskReply:
        """Answer with the URLs it was given (it fetches nothing either)."""
        conversations.seen.append(("link.take", ctx.parts))
        urls = [part.url for part in ctx.parts if isinstance(part, UrlPart)]
        return TaskReply(artifacts=(Artifact(tuple(TextPart(url) for url in urls)),))

    registry.register(take)
    return await started(agent_config(pki, tmp_path, "alice", policy), registry)


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, conversations: Conversations) -> AsyncIterator[Agent]:
    agent = await start_alice(pki, tmp_path, conversations)
    yield agent
    await agent.stop()


@pytest.fixture
async def bob(pki: Pki, alice: Agent) -> AsyncIterator[A2APeer]:
    async with A2APeer(pki, alice, "bob") as peer:
        yield peer


async def _still_waiting(bob: A2APeer, task_id: str) -> None:
    task = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
    assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED


async def _task_rows(agent: Agent, task_id: str) -> list[tuple[str, str, str]]:
    return [(r.peer_id, r.decision, r.reason) for r in await records(agent) if r.task_id == task_id]


async def test_a_follow_up_over_the_payload_cap_is_refused_before_it_is_read(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)
    big = message(data={"city": "x" * 600}, task_id=task.id)
    with pytest.raises(a2a_errors.A2AError) as info:
        await bob.send(big)
    assert gateway_reason(info.value) == "PAYLOAD_TOO_LARGE"
    await _still_waiting(bob, task.id)
    assert [name for name, _ in conversations.seen] == ["trip.book"]  # not resumed
    assert await _task_rows(alice, task.id) == [(BOB, "refuse", "PAYLOAD_TOO_LARGE")]


async def test_a_follow_up_of_a_media_type_not_accepted_is_content_type_not_supported(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    task = await ask_trip(bob)  # trip.book takes text and data, no files
    follow_up = message(task_id=task.id)
    follow_up.message.parts.add(raw=b"\x89PNG", media_type="image/png", filename="a.png")
    with pytest.raises(a2a_errors.A2AError) as info:
        await bob.send(follow_up)
    assert gateway_reason(info.value) == "CONTENT_TYPE_NOT_SUPPORTED"
    await _still_waiting(bob, task.id)
    assert [name for name, _ in conversations.seen] == ["trip.book"]
    assert await _task_rows(alice, task.id) == [(BOB, "refuse", "CONTENT_TYPE_NOT_SUPPORTED")]
    done = await bob.send(message(data={"city": "Oslo"}, task_id=task.id))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED


async def test_a_follow_up_is_rate_limited_as_any_message(
    pki: Pki, tmp_path: Path, conversations: Conversations
) -> None:
    alice = await start_alice(pki, tmp_path, conversations, max_calls_per_second=0.001, burst=1)
    try:
        async with A2APeer(pki, alice, "bob") as bob:
            task = await ask_trip(bob)  # the one token of the burst
            with pytest.raises(A2AClientError) as info:  # the SDK maps no spec error to it
                await bob.send(message(data={"city": "Oslo"}, task_id=task.id))
            assert gateway_reason(info.value) == "RATE_LIMITED"
            assert [name for name, _ in conversations.seen] == ["trip.book"]
            assert await _task_rows(alice, task.id) == [(BOB, "refuse", "RATE_LIMITED")]
    finally:
        await alice.stop()


async def test_a_url_part_is_never_fetched_and_never_audited(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    dialled: list[str] = []

    async def note(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dialled.append("connection")
        writer.close()

    server = await asyncio.start_server(note, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/report.txt?secret=s3cr3t"
    try:
        request = message("link.take", text="take it")
        request.message.parts.add(url=url, media_type="text/plain", filename="report.txt")
        task = await bob.send(request)
        await asyncio.sleep(0)  # a dial the gateway started would have been accepted by now
    finally:
        server.close()
        await server.wait_closed()
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert texts(task.artifacts[0]) == [url]
    [(name, parts)] = conversations.seen
    assert name == "link.take" and parts[1] == UrlPart(url, "text/plain", "report.txt")
    assert dialled == []
    rows = await records(alice)
    assert [(r.capability, r.decision, r.reason) for r in rows] == [("link.take", "allow", "OK")]
    assert not any("s3cr3t" in r.detail or str(port) in r.detail for r in rows)
