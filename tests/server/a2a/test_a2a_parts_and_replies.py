"""A2A parts in and replies out: files, text, URLs, several artifacts, Message answers.

Real agents on 127.0.0.1 with mTLS and the a2a-sdk gRPC client; the payload
cap counts every part before any is decoded, a part the contract does not take
is CONTENT_TYPE_NOT_SUPPORTED (audited, nothing runs), and a reply's one
canonical JSON is what is digested, capped and answered over Invoke too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format

from capabilities import FilePart, TextPart
from gateway.runtime.agent import Agent
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.a2a_conversations import message, records, start_alice, texts
from tests.helpers.a2a_grpc import V1, A2APeer, gateway_reason, sdk_client
from tests.helpers.agents import Pki, raw_channel, spiffe
from tests.helpers.conversation_capabilities import Conversations

BOB = spiffe("bob")


@pytest.fixture
def conversations() -> Conversations:
    return Conversations()


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, conversations: Conversations) -> AsyncIterator[Agent]:
    agent = await start_alice(pki, tmp_path, conversations)
    yield agent
    await agent.stop()


def files(capability: str, *parts: a2a_pb2.Part) -> a2a_pb2.SendMessageRequest:
    request = message(capability)
    request.message.parts.extend(parts)
    return request


async def answer_of(peer: A2APeer, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.StreamResponse:
    """The one event a blocking SendMessage answers (a task or a message)."""
    [event] = [event async for event in peer.client.send_message(request)]
    return event


# --- parts in -------------------------------------------------------------------------


async def test_a_file_part_in_and_a_text_artifact_out(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    request = files(
        "doc.words",
        a2a_pb2.Part(raw=b"one two three", media_type="text/plain", filename="a.txt"),
        a2a_pb2.Part(raw=b"four five", media_type="text/markdown; charset=utf-8", filename="b.md"),
        a2a_pb2.Part(text="count these"),
    )
    task = await bob.send(request)
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    [artifact] = task.artifacts
    assert artifact.name == "counts" and artifact.artifact_id == f"{task.id}-output"
    assert texts(artifact) == ["a.txt: 3 words", "b.md: 2 words"]
    assert artifact.metadata["a2agw.evidence_sha256"]
    [(_, parts)] = conversations.seen
    assert parts == (
        FilePart(b"one two three", "text/plain", "a.txt"),
        FilePart(b"four five", "text/markdown; charset=utf-8", "b.md"),
        TextPart("count these"),
    )
    [row] = [r for r in await records(alice) if r.task_id == task.id]
    assert (row.decision, row.reason) == ("allow", "OK")
    # Sizes and digests only: the record holds those of the JSON input the message became
    # (no data part: {}); the cap counted every part (below).
    assert (row.payload_size, row.payload_sha256) == (2, hashlib.sha256(b"{}").hexdigest())


@pytest.mark.parametrize(
    ("part", "what"),
    [
        (a2a_pb2.Part(raw=b"\x89PNG", media_type="image/png"), "media type 'image/png'"),
        (a2a_pb2.Part(raw=b"x"), "media type 'application/octet-stream'"),
        (a2a_pb2.Part(url="https://example.com/a.txt", media_type="text/plain"), "URL parts"),
    ],
)
async def test_a_part_the_contract_does_not_take_is_content_type_not_supported(
    alice: Agent, bob: A2APeer, conversations: Conversations, part: a2a_pb2.Part, what: str
) -> None:
    with pytest.raises(a2a_errors.ContentTypeNotSupportedError) as info:
        await bob.send(files("doc.words", part))
    rpc = info.value.__cause__
    assert isinstance(rpc, grpc.aio.AioRpcError)
    assert rpc.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert gateway_reason(info.value) == "CONTENT_TYPE_NOT_SUPPORTED"
    assert what in rpc.details() and "text/*" in rpc.details()
    assert conversations.seen == []
    row = (await records(alice))[-1]
    assert (row.decision, row.reason, row.capability) == (
        "refuse",
        "CONTENT_TYPE_NOT_SUPPORTED",
        "doc.words",
    )


async def test_a_data_part_to_a_contract_taking_none_is_content_type_not_supported(
    alice: Agent, bob: A2APeer
) -> None:
    with pytest.raises(a2a_errors.ContentTypeNotSupportedError):
        await bob.send(message("doc.words", data={"n": 1}))


async def test_the_cap_counts_every_part_before_any_is_decoded(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    half = a2a_pb2.Part(raw=b"w " * 1500, media_type="text/plain")  # 3000 + 10 bytes
    task = await bob.send(files("doc.words", half, a2a_pb2.Part(text="x")))
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    with pytest.raises(a2a_errors.A2AError) as info:  # bob's cap: 4096 bytes over all parts
        await bob.send(files("doc.words", half, half, a2a_pb2.Part(text="x")))
    assert gateway_reason(info.value) == "PAYLOAD_TOO_LARGE"
    assert len(conversations.seen) == 1
    rows = await records(alice)
    assert (rows[-1].reason, rows[-1].payload_size) == ("PAYLOAD_TOO_LARGE", 2 * 3010 + 1)


async def test_more_parts_than_the_contract_takes_are_invalid_request(
    alice: Agent, bob: A2APeer
) -> None:
    four = [a2a_pb2.Part(text=str(n)) for n in range(4)]
    with pytest.raises(a2a_errors.InvalidRequestError) as info:
        await bob.send(files("doc.words", *four))
    assert "takes at most 3" in str(info.value)


@pytest.mark.parametrize(
    "part",
    [
        a2a_pb2.Part(),
        a2a_pb2.Part(text="x", media_type="not a media type"),
        a2a_pb2.Part(raw=b"x", media_type="text/plain", filename="a\nb"),
        a2a_pb2.Part(url="https://exa mple.com"),
    ],
)
async def test_a_malformed_part_is_invalid_request(
    alice: Agent, bob: A2APeer, part: a2a_pb2.Part
) -> None:
    with pytest.raises(a2a_errors.InvalidRequestError):
        await bob.send(files("doc.words", part))


# --- replies out --------------------------------------------------------------------------


async def test_artifacts_of_every_part_kind(alice: Agent, bob: A2APeer) -> None:
    task = await bob.send(message("out.kinds", text="all"))
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert texts(task.status.message) == ["four artifacts"]
    ids = [a.artifact_id for a in task.artifacts]
    assert ids == [f"{task.id}-output", f"{task.id}-output-1", f"{task.id}-output-2",
                   f"{task.id}-output-3"]  # fmt: skip
    text, file, url, data = (a.parts[0] for a in task.artifacts)
    assert (text.text, text.media_type) == ("Generated text content", "")
    assert (file.raw, file.media_type, file.filename) == (b"tck", "text/plain", "output.txt")
    assert (url.url, url.media_type, url.filename) == (
        "https://example.com/output.txt",
        "text/plain",
        "o.txt",
    )
    assert json_format.MessageToDict(data.data) == {"key": "value", "count": 42.0}
    evidence = {a.metadata["a2agw.evidence_sha256"] for a in task.artifacts}
    assert len(evidence) == 1  # one digest over the whole answer


async def test_a_reply_part_the_contract_does_not_give_is_invalid_output(
    alice: Agent, bob: A2APeer
) -> None:
    task = await bob.send(message("out.kinds", text="image"))
    assert task.status.state == a2a_pb2.TASK_STATE_FAILED
    assert task.metadata["a2agw.reason"] == "INVALID_OUTPUT"
    assert task.status.message.parts[0].text.endswith(
        "a file part of media type 'image/png', not given"
    )


async def test_invoke_answers_a_replys_canonical_json_and_digests_it(
    pki: Pki, alice: Agent
) -> None:
    async with raw_channel(pki, alice, "bob") as channel:
        answer = await gateway_pb2_grpc.PeerGatewayStub(channel).Invoke(
            gateway_pb2.InvokeRequest(
                request_id="r-1", capability="out.kinds", payload=b'{"text":"all"}'
            ),
            timeout=10,
        )
    output = json.loads(answer.payload)
    assert output["a2agw.reply"] == "task" and output["text"] == "four artifacts"
    assert [a["parts"][0]["kind"] for a in output["artifacts"]] == ["text", "file", "url", "data"]
    assert base64.b64decode(output["artifacts"][1]["parts"][0]["bytes"]) == b"tck"
    assert answer.evidence_sha256 == hashlib.sha256(answer.payload).hexdigest()
    assert answer.payload == json.dumps(output, sort_keys=True, separators=(",", ":")).encode()


async def test_text_chunks_stream_as_text_parts(alice: Agent, bob: A2APeer) -> None:
    events = [
        event
        async for event in bob.stub.SendStreamingMessage(
            message("chunks.text", text="go"), metadata=V1, timeout=10
        )
    ]
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert [
        (c.append, c.last_chunk, c.artifact.parts[0].WhichOneof("content")) for c in chunks
    ] == [
        (False, False, "text"),
        (True, False, "text"),
        (True, False, "data"),
    ]
    assert [chunks[0].artifact.parts[0].text, chunks[1].artifact.parts[0].text] == [
        "chunk-1 ",
        "chunk-2",
    ]
    assert events[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED


# --- Message answers ------------------------------------------------------------------------


async def test_a_message_answer_keeps_no_task(
    alice: Agent, bob: A2APeer, conversations: Conversations
) -> None:
    event = await answer_of(bob, message("chat.reply", text="bob", context_id="c-9"))
    assert event.WhichOneof("payload") == "message"
    reply = event.message
    assert texts(reply) == ["hello bob"] and reply.role == a2a_pb2.ROLE_AGENT
    assert reply.context_id == "c-9" and reply.task_id == ""
    assert reply.metadata["a2agw.served_version"] == "1.0.0"
    listed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest())
    assert len(listed.tasks) == 0
    row = (await records(alice))[-1]
    assert (row.decision, row.reason, row.capability) == ("allow", "OK", "chat.reply")
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await bob.client.get_task(a2a_pb2.GetTaskRequest(id=row.task_id))


async def test_messages_only_answer_a_message_even_asked_to_return_immediately(
    alice: Agent, bob: A2APeer
) -> None:
    request = message("chat.reply", text="now")
    request.configuration.return_immediately = True
    event = await answer_of(bob, request)
    assert event.WhichOneof("payload") == "message" and texts(event.message) == ["hello now"]


async def test_a_stream_answered_with_a_message_is_that_one_message(
    alice: Agent, bob: A2APeer
) -> None:
    for capability, text in (("chat.reply", "x"), ("chat.either", "message")):
        events = [
            event
            async for event in bob.stub.SendStreamingMessage(
                message(capability, text=text), metadata=V1, timeout=10
            )
        ]
        assert [e.WhichOneof("payload") for e in events] == ["message"], capability
    listed = await bob.client.list_tasks(a2a_pb2.ListTasksRequest())
    assert len(listed.tasks) == 0  # no task kept for either


async def test_a_stream_of_a_capability_that_may_answer_a_message_but_answers_a_task(
    alice: Agent, bob: A2APeer
) -> None:
    kinds = []
    async for event in bob.stub.SendStreamingMessage(
        message("chat.either", text="task"), metadata=V1, timeout=10
    ):
        kinds.append(_kind(event))
    assert kinds == ["task:SUBMITTED", "status:WORKING", "artifact", "status:COMPLETED"]


async def test_a_message_after_the_task_was_seen_is_its_final_status(
    alice: Agent, bob: A2APeer
) -> None:
    kinds, last = [], None
    async for event in bob.stub.SendStreamingMessage(
        message("chat.either", text="progress then message"), metadata=V1, timeout=10
    ):
        kinds.append(_kind(event))
        last = event
    assert kinds == ["task:SUBMITTED", "status:WORKING", "status:WORKING", "status:COMPLETED"]
    assert last is not None and texts(last.status_update.status.message) == ["a message"]
    request = message("chat.either", text="message")
    request.configuration.return_immediately = True  # the task is answered at once
    task = (await answer_of(bob, request)).task
    for _ in range(100):
        seen = await bob.client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
        if seen.status.state == a2a_pb2.TASK_STATE_COMPLETED:
            break
    assert texts(seen.status.message) == ["a message"] and len(seen.artifacts) == 0


def _kind(event: a2a_pb2.StreamResponse) -> str:
    which = event.WhichOneof("payload")
    if which == "task":
        return "task:" + a2a_pb2.TaskState.Name(event.task.status.state)[11:]
    if which == "status_update":
        return "status:" + a2a_pb2.TaskState.Name(event.status_update.status.state)[11:]
    return str(which).replace("_update", "")


async def test_an_sdk_streaming_client_gets_the_message(alice: Agent, bob: A2APeer) -> None:
    client = sdk_client(bob.channel, alice, streaming=True)
    events: list[Any] = [e async for e in client.send_message(message("chat.reply", text="s"))]
    assert [e.WhichOneof("payload") for e in events] == ["message"]
    assert texts(events[0].message) == ["hello s"]
    assert str(uuid.UUID(events[0].message.message_id.removesuffix("-reply")))
