"""``tck.conformance``: the A2A TCK's scenarios from the public capability API, routed on the
message id as the kit's reference agent routes them, as the default capability."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from gateway.runtime.agent import Agent
from tests.helpers.a2a_conversations import texts
from tests.helpers.a2a_grpc import V1, A2APeer
from tests.helpers.agents import Pki, agent_config, grant, started, write_policy


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["tck.conformance"])])
    config = agent_config(pki, tmp_path, "alice", policy, modules=("capabilities.conformance",))
    config = config.model_copy(
        update={"a2a": config.a2a.model_copy(update={"default_capability": "tck.conformance"})}
    )
    agent = await started(config)
    yield agent
    await agent.stop()


def scenario(name: str, *, task_id: str = "") -> a2a_pb2.SendMessageRequest:
    """A message as the kit sends it: one text part, no metadata, an id naming the scenario."""
    return a2a_pb2.SendMessageRequest(
        message=a2a_pb2.Message(
            message_id=f"tck-{name}-{uuid.uuid4().hex}",
            role=a2a_pb2.ROLE_USER,
            task_id=task_id,
            parts=[a2a_pb2.Part(text="TCK")],
        )
    )


async def answer(peer: A2APeer, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.StreamResponse:
    [event] = [event async for event in peer.client.send_message(request)]
    return event


async def test_artifact_scenarios(alice: Agent, bob: A2APeer) -> None:
    text = await bob.send(scenario("artifact-text"))
    assert [texts(a) for a in text.artifacts] == [["Generated text content"]]
    file = (await bob.send(scenario("artifact-file"))).artifacts[0].parts[0]
    assert (file.raw, file.media_type, file.filename) == (b"tck", "text/plain", "output.txt")
    url = (await bob.send(scenario("artifact-file-url"))).artifacts[0].parts[0]
    assert (url.url, url.filename) == ("https://example.com/output.txt", "output.txt")
    data = (await bob.send(scenario("artifact-data"))).artifacts[0].parts[0]
    assert json_format.MessageToDict(data.data) == {"key": "value", "count": 42.0}


async def test_message_and_status_scenarios(alice: Agent, bob: A2APeer) -> None:
    event = await answer(bob, scenario("message-response"))
    assert texts(event.message) == ["Direct message response"]
    done = await bob.send(scenario("complete-task"))
    assert done.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert texts(done.status.message) == ["Hello from TCK"]
    rejected = await bob.send(scenario("reject-task"))
    assert rejected.status.state == a2a_pb2.TASK_STATE_FAILED
    other = await bob.send(scenario("something-else"))
    assert texts(other.status.message)[0].startswith("Unhandled messageId prefix: tck-something")


async def test_input_required_is_continued_by_the_answers_own_scenario(
    alice: Agent, bob: A2APeer
) -> None:
    task = await bob.send(scenario("input-required"))
    assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    again = await bob.send(scenario("input-required", task_id=task.id))
    assert again.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    done = await bob.send(scenario("complete-task", task_id=task.id))
    assert (done.id, done.status.state) == (task.id, a2a_pb2.TASK_STATE_COMPLETED)
    assert [texts(m) for m in done.history] == [
        ["TCK"],
        ["The TCK scenario asks for more input"],
        ["TCK"],
        ["The TCK scenario asks for more input"],
        ["TCK"],
        ["Hello from TCK"],
    ]


async def test_streamed_chunks_are_text(alice: Agent, bob: A2APeer) -> None:
    events = [
        e
        async for e in bob.stub.SendStreamingMessage(
            scenario("stream-artifact-chunked"), metadata=V1, timeout=10
        )
    ]
    chunks = [
        e.artifact_update.artifact.parts[0].text for e in events if e.HasField("artifact_update")
    ]
    assert chunks == ["chunk-1 ", "chunk-2"]
    assert events[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED
