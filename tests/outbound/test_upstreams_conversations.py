"""A fronted a2a-sdk agent keeps all of it: parts, Message answers, questions, message ids.

alice and carol (a2a-sdk clients over A2A gRPC, or a2agw.v1 Invoke) call bob,
which fronts a real conversing a2a-sdk agent (``tests.a2a_conversing_upstream``)
over gRPC or JSON-RPC. Its skills (all answered alike) are served as: ``talk.pass``
(``accepts``/``gives``: parts both ways as they are), ``talk.text`` (no
``accepts``/``gives``: text in, ``{"text"}`` out, ``asks_input = true``), ``talk.mute``
(``asks_input = false``), and ``talk.search`` (``accepts``/``gives`` and
schemas). Each test checks what the caller got, what reached
the upstream (ids, parts, metadata, no push config), what it was asked to
cancel, and bob's audit records.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig
from gateway.errors import CapabilityFailed
from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversing_upstream import ConversingAgent
from tests.helpers.a2a_grpc import V1, A2APeer
from tests.helpers.a2a_upstream import grpc_upstream, jsonrpc_upstream
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, write_policy

LEGACY = spiffe("legacy")
INPUT_REQUIRED = a2a_pb2.TASK_STATE_INPUT_REQUIRED
AUTH_REQUIRED = a2a_pb2.TASK_STATE_AUTH_REQUIRED
COMPLETED = a2a_pb2.TASK_STATE_COMPLETED
CANCELED = a2a_pb2.TASK_STATE_CANCELED
ALL_PARTS = {"data": True, "text": True, "files": ["*/*"], "urls": True, "max_parts": 8}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
}


GIVES = {"data": True, "text": True, "files": ["*/*"], "urls": True, "messages": True}


def talk_skills(timeout: float) -> list[dict[str, Any]]:
    base = {"version": "1.0.0", "risk": "read", "timeout": timeout}
    return [
        {**base, "skill": "pass", "capability": "talk.pass", "accepts": ALL_PARTS, "gives": GIVES},
        {**base, "skill": "text", "capability": "talk.text", "asks_input": True},
        {
            **base,
            "skill": "mute",
            "capability": "talk.mute",
            "accepts": ALL_PARTS,
            "asks_input": False,
        },
        {
            **base,
            "skill": "search",
            "capability": "talk.search",
            "input_schema": SEARCH,
            "output_schema": SEARCH,
            "accepts": {"data": True, "text": True, "max_parts": 4},
            "gives": {"data": True, "text": True, "files": ["*/*"], "urls": True},
        },
    ]


@contextlib.asynccontextmanager
async def fronting(
    pki: Pki, base: Path, upstream: ConversingAgent, binding: str = "grpc", timeout: float = 10.0
) -> AsyncIterator[Agent]:
    """bob fronting ``upstream`` (mTLS, over ``binding``) with the ``talk.*`` skills."""
    serve = grpc_upstream if binding == "grpc" else jsonrpc_upstream
    async with serve(upstream, pki, "legacy") as where:  # type: ignore[operator,arg-type]
        key = "address" if binding == "grpc" else "url"
        entry = {
            "id": LEGACY,
            "binding": binding,
            key: where,
            "skills": talk_skills(timeout),
        }
        capabilities = ["talk.pass", "talk.text", "talk.mute", "talk.search"]
        policy = write_policy(
            base / "bob-policy.toml", [grant("alice", capabilities), grant("carol", capabilities)]
        )
        plain = agent_config(pki, base, "bob", policy)
        config = AgentConfig.model_validate({**plain.model_dump(), "upstreams": [entry]})
        bob = Agent(config, CapabilityRegistry())
        await bob.start(watch_policy=False)
        try:
            yield bob
        finally:
            await bob.stop(grace=0)


def message(
    capability: str,
    *parts: a2a_pb2.Part,
    message_id: str = "",
    task_id: str = "",
    context_id: str = "",
) -> a2a_pb2.SendMessageRequest:
    request = a2a_pb2.SendMessageRequest()
    sent = request.message
    sent.message_id = message_id or f"m-{uuid.uuid4().hex}"
    sent.role = a2a_pb2.ROLE_USER
    if capability:
        sent.metadata["a2agw.capability"] = capability
    if task_id:
        sent.task_id = task_id
    if context_id:
        sent.context_id = context_id
    for part in parts:
        sent.parts.add().CopyFrom(part)
    return request


def text(value: str) -> a2a_pb2.Part:
    return a2a_pb2.Part(text=value)


def data(value: dict[str, Any]) -> a2a_pb2.Part:
    part = a2a_pb2.Part(media_type="application/json")
    json_format.ParseDict(value, part.data)
    return part


async def send(peer: A2APeer, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.SendMessageResponse:
    """A blocking SendMessage: the task at its next interrupted or terminal state, or a Message."""
    answer: a2a_pb2.SendMessageResponse = await peer.stub.SendMessage(
        request, metadata=V1, timeout=30
    )
    return answer


def parts_of(parts: Any) -> list[dict[str, Any]]:
    return [json_format.MessageToDict(part) for part in parts]


async def records(bob: Agent) -> list[tuple[str, str, str, str]]:
    await bob.audit.flush()
    return [
        (r.peer_id.rsplit("/", 1)[-1], r.capability, r.decision, r.reason)
        for r in audit_rows(bob.config.audit_db)
    ]


@pytest.mark.parametrize("binding", ["grpc", "jsonrpc"])
async def test_parts_pass_through_both_ways_with_the_callers_message_id(
    pki: Pki, tmp_path: Path, binding: str
) -> None:
    upstream = ConversingAgent()
    sent = [
        text("hello"),
        data({"n": 1, "tags": ["a"]}),
        a2a_pb2.Part(raw=b"\x00\x01csv", media_type="text/csv", filename="in.csv"),
        a2a_pb2.Part(url="https://example.org/x", media_type="image/png", filename="x.png"),
    ]
    async with fronting(pki, tmp_path, upstream, binding) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            request = message("talk.pass", *sent, message_id="alice-m-1")
            request.message.metadata["note"] = "not for the upstream"
            request.metadata["trace"] = "not for the upstream either"
            answer = await send(alice, request)
        rows = await records(bob)
    task = answer.task
    assert task.status.state == COMPLETED
    assert task.status.message.parts[0].text == "done"
    assert [a.name for a in task.artifacts] == ["echo", "file"]
    assert parts_of(task.artifacts[0].parts) == parts_of(sent)  # as the upstream gave them
    assert parts_of(task.artifacts[1].parts) == [
        {"raw": "JVBERi0xLjcgdGNr", "mediaType": "application/pdf", "filename": "answer.pdf"},
        {"url": "https://example.org/a.txt?k=v", "mediaType": "text/plain", "filename": "a.txt"},
    ]
    [heard] = upstream.heard
    assert heard.message_id == "alice-m-1"  # the caller's id, not a fresh one
    assert heard.parts == parts_of(sent)
    assert heard.metadata == {"a2agw.skill": "pass"}  # nothing else of the caller's
    assert heard.request_metadata == {}
    assert (heard.continued, heard.push_config) == (False, False)
    assert rows == [("alice", "talk.pass", "allow", "OK")]


async def test_a_message_answer_passes_through_as_a_message(pki: Pki, tmp_path: Path) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("talk.pass", text("reply"), data({"k": "v"})))
        rows = await records(bob)
    assert answer.WhichOneof("payload") == "message"
    assert parts_of(answer.message.parts) == [
        {"text": "reply"},
        {"data": {"k": "v"}, "mediaType": "application/json"},
    ]
    assert answer.message.role == a2a_pb2.ROLE_AGENT
    assert rows == [("alice", "talk.pass", "allow", "OK")]


@pytest.mark.parametrize("binding", ["grpc", "jsonrpc"])
async def test_questions_pass_through_and_answers_reach_the_same_upstream_task(
    pki: Pki, tmp_path: Path, binding: str
) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream, binding) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            asked = (await send(alice, message("talk.pass", text("ask Which city?")))).task
            again = await send(
                alice, message("", text("auth Sign in first"), task_id=asked.id, message_id="a-2")
            )
            done = await send(
                alice, message("", text("Lisbon"), task_id=asked.id, message_id="a-3")
            )
        rows = await records(bob)
    assert asked.status.state == INPUT_REQUIRED
    assert parts_of(asked.status.message.parts) == [{"text": "Which city?"}]
    assert again.task.id == asked.id and again.task.status.state == AUTH_REQUIRED
    assert parts_of(again.task.status.message.parts) == [{"text": "Sign in first"}]
    final = done.task
    assert (final.id, final.status.state) == (asked.id, COMPLETED)
    assert parts_of(final.artifacts[0].parts) == [{"text": "Lisbon"}]
    first, second, third = upstream.heard
    # Every follow-up went to the upstream's own task, in its own context, with the
    # caller's message id.
    assert [h.continued for h in upstream.heard] == [False, True, True]
    assert [(h.served_task, h.served_context) for h in upstream.heard] == [
        (first.served_task, first.served_context)
    ] * 3
    assert [second.message_id, third.message_id] == ["a-2", "a-3"]
    assert [h.parts for h in (second, third)] == [
        [{"text": "auth Sign in first"}],
        [{"text": "Lisbon"}],
    ]
    assert upstream.cancelled == []
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("talk.pass", "allow", "OK"),  # the first follow-up, admitted
        ("talk.pass", "allow", "OK"),  # the second
        ("talk.pass", "allow", "OK"),  # the run, once, when it ended
    ]


async def test_a_streaming_caller_sees_the_question_and_streams_the_answer(
    pki: Pki, tmp_path: Path
) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            first = [
                e
                async for e in alice.stub.SendStreamingMessage(
                    message("talk.pass", text("ask Which city?")), metadata=V1, timeout=30
                )
            ]
            task_id = first[0].task.id
            second = [
                e
                async for e in alice.stub.SendStreamingMessage(
                    message("", text("Porto"), task_id=task_id), metadata=V1, timeout=30
                )
            ]
    assert first[-1].status_update.status.state == INPUT_REQUIRED
    assert parts_of(first[-1].status_update.status.message.parts) == [{"text": "Which city?"}]
    assert second[-1].status_update.status.state == COMPLETED
    echoed = [e.artifact_update.artifact for e in second if e.HasField("artifact_update")]
    assert parts_of(echoed[0].parts) == [{"text": "Porto"}]
    assert [h.served_task for h in upstream.heard] == [upstream.heard[0].served_task] * 2


async def test_a_question_without_words_still_reaches_the_caller(pki: Pki, tmp_path: Path) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            asked = (await send(alice, message("talk.text", text("ask")))).task
            done = (await send(alice, message("", text("fine"), task_id=asked.id))).task
    assert asked.status.state == INPUT_REQUIRED
    assert asked.status.message.parts[0].text  # the gateway's words: the upstream said none
    # talk.text: text in, {"text"} out, as before; the question passed on all the same.
    assert json_format.MessageToDict(done.artifacts[0].parts[0].data) == {"text": "fine"}


async def test_cancel_while_waiting_cancels_the_upstream_task(pki: Pki, tmp_path: Path) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            asked = (await send(alice, message("talk.pass", text("ask Which city?")))).task
            canceled = await alice.stub.CancelTask(
                a2a_pb2.CancelTaskRequest(id=asked.id), metadata=V1, timeout=30
            )
        rows = await records(bob)
    assert canceled.status.state == CANCELED
    assert upstream.cancelled == [upstream.heard[0].served_task]
    assert rows == [("alice", "talk.pass", "allow", "CANCELLED")]


async def test_a_call_that_cannot_ask_fails_and_cancels_the_upstream_task(
    pki: Pki, tmp_path: Path
) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice:  # asks_input = false
            muted = (await send(alice, message("talk.mute", text("ask Which city?")))).task
        async with PeerClient(spiffe("bob"), bob.address, pki.material("alice")) as peer:
            with pytest.raises(CapabilityFailed):  # Invoke: nobody to ask
                await peer.invoke("talk.text", {"text": "ask Which city?"})
            passed = await peer.invoke("talk.pass", {"say": "hi"})
        rows = await records(bob)
    assert muted.status.state == a2a_pb2.TASK_STATE_FAILED
    assert muted.status.message.metadata["a2agw.reason"] == "CAPABILITY_FAILED"
    assert not muted.history  # asks_input = false: no history kept
    asked = [h.served_task for h in upstream.heard[:2]]
    assert upstream.cancelled == asked  # neither left waiting upstream
    # Invoke sends a passing skill's input object as one data part.
    assert upstream.heard[2].parts == [{"data": {"say": "hi"}, "mediaType": "application/json"}]
    assert passed.output()["a2agw.reply"] == "task"
    assert [r[3] for r in rows] == ["CAPABILITY_FAILED", "CAPABILITY_FAILED", "OK"]


async def test_declared_schemas_are_still_checked(pki: Pki, tmp_path: Path) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            found = (
                await send(
                    alice, message("talk.search", data({"query": "q", "limit": 2}), text("hi"))
                )
            ).task
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await send(alice, message("talk.search", data({"query": "q", "secret": "s"})))
        rows = await records(bob)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(upstream.heard) == 1  # the refused one never reached it
    assert upstream.heard[0].parts == [
        {"data": {"query": "q", "limit": 2}, "mediaType": "application/json"},
        {"text": "hi"},
    ]
    echo = parts_of(found.artifacts[0].parts)
    assert echo[0]["data"] == {"query": "q", "limit": 2}
    assert [r[3] for r in rows] == ["OK", "INVALID_INPUT"]


async def test_two_callers_with_one_message_id_and_one_context_stay_apart(
    pki: Pki, tmp_path: Path
) -> None:
    upstream = ConversingAgent()
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice, A2APeer(pki, bob, "carol") as carol:
            for peer, message_id in ((alice, "same"), (carol, "same"), (alice, "later")):
                await send(
                    peer, message("talk.pass", text("x"), message_id=message_id, context_id="ctx")
                )
    alice_1, carol_1, alice_2 = upstream.heard
    assert alice_1.message_id == "same"  # kept: nobody sent it there before
    assert carol_1.message_id.startswith("same:") and len(carol_1.message_id) == len("same:") + 16
    assert alice_2.message_id == "later"
    # Caller context ids are never sent; the upstream's own are kept per caller and context.
    assert "ctx" not in {alice_1.served_context, carol_1.served_context}
    assert alice_2.served_context == alice_1.served_context
    assert carol_1.served_context != alice_1.served_context


async def test_only_the_owner_continues_and_each_follow_up_is_checked_and_audited(
    pki: Pki, tmp_path: Path
) -> None:
    upstream = ConversingAgent()
    chunk = a2a_pb2.Part(raw=b"x" * 30_000, media_type="text/plain", filename="part.txt")
    async with fronting(pki, tmp_path, upstream) as bob:
        async with A2APeer(pki, bob, "alice") as alice, A2APeer(pki, bob, "carol") as carol:
            asked = (await send(alice, message("talk.pass", text("ask Which city?")))).task
            with pytest.raises(grpc.aio.AioRpcError) as foreign:
                await send(carol, message("", text("Paris"), task_id=asked.id))
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await send(carol, message("", text("Paris"), task_id="no-such-task"))
            # Each part under the grant's 64 KiB, all three over it: refused before parsing.
            with pytest.raises(grpc.aio.AioRpcError) as too_large:
                await send(alice, message("", chunk, chunk, chunk, task_id=asked.id))
            waiting = await alice.stub.GetTask(
                a2a_pb2.GetTaskRequest(id=asked.id), metadata=V1, timeout=30
            )
            done = (await send(alice, message("", text("Lisbon"), task_id=asked.id))).task
        rows = await records(bob)
    # Another's task and no task are answered alike.
    assert (foreign.value.code(), unknown.value.code()) == (grpc.StatusCode.NOT_FOUND,) * 2
    assert foreign.value.details() == unknown.value.details()
    assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert waiting.status.state == INPUT_REQUIRED  # the refusals left it waiting
    assert (done.id, done.status.state) == (asked.id, COMPLETED)
    # Only alice's first message and her one admitted answer reached the upstream task.
    assert [h.parts for h in upstream.heard] == [
        [{"text": "ask Which city?"}],
        [{"text": "Lisbon"}],
    ]
    assert upstream.heard[1].continued
    assert rows == [
        ("carol", "", "refuse", "TASK_NOT_FOUND"),
        ("carol", "", "refuse", "TASK_NOT_FOUND"),
        ("alice", "talk.pass", "refuse", "PAYLOAD_TOO_LARGE"),
        ("alice", "talk.pass", "allow", "OK"),  # the answer, admitted
        ("alice", "talk.pass", "allow", "OK"),  # the run, once, when it ended
    ]
