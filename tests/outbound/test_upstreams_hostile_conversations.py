"""Hostile upstreams in a conversation: endless questions, foreign tasks, parts that are no parts.

bob fronts a scripted gRPC A2A upstream (a servicer of the test's own, mTLS)
whose skill passes parts both ways (``accepts``/``gives``); alice talks to
bob over A2A (blocking SendMessage, answering questions on her task). Each
test checks alice's outcome and reason, bob's audit records, what the
upstream was asked to cancel (its own task, once; never another's), and that
bob gave back alice's in-flight slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc

from capabilities.registry import CapabilityRegistry
from gateway.client.a2a.upstream_parts import MAX_ANSWER_PARTS
from gateway.client.a2a.upstream_replies import MAX_PROMPT_BYTES
from gateway.config import AgentConfig
from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import V1, A2APeer
from tests.helpers.a2a_hostile_upstream import scripted_grpc_upstream
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, spiffe, write_policy

LEGACY = spiffe("legacy")
TASK, OTHER = "t-1", "someone-elses-task"
INPUT_REQUIRED = a2a_pb2.TASK_STATE_INPUT_REQUIRED
COMPLETED = a2a_pb2.TASK_STATE_COMPLETED
FAILED = a2a_pb2.TASK_STATE_FAILED
CAP = 4096
EVERYTHING = {"data": True, "text": True, "files": ["*/*"], "urls": True}


def task_answer(
    state: int, *parts: a2a_pb2.Part, task_id: str = TASK, question: str = ""
) -> a2a_pb2.SendMessageResponse:
    answer = a2a_pb2.SendMessageResponse()
    task = answer.task
    task.id, task.context_id = task_id, "c-1"
    task.status.state = state  # type: ignore[assignment]
    if question:
        task.status.message.role = a2a_pb2.ROLE_AGENT
        task.status.message.parts.add(text=question)
    if parts:
        artifact = task.artifacts.add(artifact_id="a", name="answer")
        for part in parts:
            artifact.parts.add().CopyFrom(part)
    return answer


def message_answer(*parts: a2a_pb2.Part) -> a2a_pb2.SendMessageResponse:
    answer = a2a_pb2.SendMessageResponse()
    answer.message.message_id, answer.message.role = "r-1", a2a_pb2.ROLE_AGENT
    for part in parts:
        answer.message.parts.add().CopyFrom(part)
    return answer


@dataclass
class Scripted(a2a_pb2_grpc.A2AServiceServicer):
    """Answers the n-th SendMessage with ``answers[n]`` (the last one repeats); records all."""

    answers: list[a2a_pb2.SendMessageResponse]
    heard: list[a2a_pb2.SendMessageRequest] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.SendMessageResponse:
        self.heard.append(request)
        return self.answers[min(len(self.heard), len(self.answers)) - 1]

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> a2a_pb2.Task:
        self.cancels.append(request.id)
        task = a2a_pb2.Task(id=request.id, context_id="c-1")
        task.status.state = a2a_pb2.TASK_STATE_CANCELED
        return task


@contextlib.asynccontextmanager
async def fronting(
    pki: Pki, base: Path, fake: Scripted, timeout: float = 10.0
) -> AsyncIterator[Agent]:
    """bob fronting ``fake`` as ``talk.pass`` (everything) and ``talk.words`` (text only)."""
    async with scripted_grpc_upstream(fake, pki) as address:
        common = {"version": "1.0.0", "risk": "read", "timeout": timeout, "accepts": EVERYTHING}
        skills = [
            {
                **common,
                "skill": "pass",
                "capability": "talk.pass",
                "gives": {**EVERYTHING, "messages": True},
            },
            {
                **common,
                "skill": "words",
                "capability": "talk.words",
                "gives": {"data": False, "text": True, "messages": True},
            },
        ]
        entry = {"id": LEGACY, "binding": "grpc", "address": address, "skills": skills}
        policy = write_policy(
            base / "bob-policy.toml",
            [grant("alice", ["talk.pass", "talk.words"], max_payload_bytes=CAP)],
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
    text: str, *, capability: str = "talk.pass", task_id: str = ""
) -> a2a_pb2.SendMessageRequest:
    request = a2a_pb2.SendMessageRequest()
    sent = request.message
    sent.message_id, sent.role = f"m-{uuid.uuid4().hex}", a2a_pb2.ROLE_USER
    if task_id:
        sent.task_id = task_id
    else:
        sent.metadata["a2agw.capability"] = capability
    sent.parts.add(text=text)
    return request


async def send(alice: A2APeer, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.SendMessageResponse:
    answer: a2a_pb2.SendMessageResponse = await alice.stub.SendMessage(
        request, metadata=V1, timeout=30
    )
    return answer


def ended(answer: a2a_pb2.SendMessageResponse) -> tuple[str, str]:
    status = answer.task.status
    metadata = status.message.metadata
    reason = metadata["a2agw.reason"] if "a2agw.reason" in metadata else ""
    return a2a_pb2.TaskState.Name(status.state), reason


async def eventually(check: Any, what: str) -> None:
    for _ in range(200):  # bounded: 10 s
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def audited(bob: Agent) -> list[str]:
    await eventually(lambda: bob.limit_stats().in_flight_total == 0, "in-flight slot given back")
    await bob.audit.flush()
    return [r.reason for r in audit_rows(bob.config.audit_db)]


async def test_an_upstream_that_asks_forever_ends_at_the_timeout(pki: Pki, tmp_path: Path) -> None:
    fake = Scripted([task_answer(INPUT_REQUIRED, question="and then?")])
    async with fronting(pki, tmp_path, fake, timeout=2.0) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start"))
            task_id, rounds, refused = answer.task.id, 0, 0
            # Paced, so that the skill's 2 s timeout ends well within the bound of rounds.
            while answer.task.status.state == INPUT_REQUIRED and rounds < 500:
                rounds += 1
                await asyncio.sleep(0.05)
                try:
                    answer = await send(alice, message(f"answer {rounds}", task_id=task_id))
                except grpc.aio.AioRpcError as err:  # the task ended between two answers
                    assert err.code() == grpc.StatusCode.UNIMPLEMENTED  # UNSUPPORTED_OPERATION
                    refused = 1
                    got = await alice.stub.GetTask(
                        a2a_pb2.GetTaskRequest(id=task_id), metadata=V1, timeout=30
                    )
                    answer = a2a_pb2.SendMessageResponse(task=got)
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            reasons = await audited(bob)
    assert 0 < rounds < 500
    assert ended(answer) == ("TASK_STATE_FAILED", "CAPABILITY_TIMEOUT")
    assert len(fake.heard) == rounds + 1 or len(fake.heard) == rounds  # the last may be refused
    assert all(r.message.task_id == TASK for r in fake.heard[1:])  # the same upstream task
    # Every answer admitted, then the run's end; a follow-up refused once it ended last.
    assert (
        reasons
        == ["OK"] * (len(reasons) - 1 - refused)
        + ["CAPABILITY_TIMEOUT"]
        + ["UNSUPPORTED_OPERATION"] * refused
    )


async def test_a_follow_up_answered_about_another_task_is_invalid_output(
    pki: Pki, tmp_path: Path
) -> None:
    other = task_answer(COMPLETED, a2a_pb2.Part(text="another's output"), task_id=OTHER)
    fake = Scripted([task_answer(INPUT_REQUIRED, question="which?"), other])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            asked = await send(alice, message("start"))
            answer = await send(alice, message("this", task_id=asked.task.id))
            await eventually(lambda: fake.cancels, "our upstream task cancelled")
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "INVALID_OUTPUT")
    assert not answer.task.artifacts  # never another task's output
    assert fake.cancels == [TASK]  # our own task, never the other one
    assert reasons == ["OK", "INVALID_OUTPUT"]


async def test_a_follow_up_whose_task_fails_is_capability_failed(pki: Pki, tmp_path: Path) -> None:
    fake = Scripted([task_answer(INPUT_REQUIRED, question="which?"), task_answer(FAILED)])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            asked = await send(alice, message("start"))
            answer = await send(alice, message("this", task_id=asked.task.id))
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "CAPABILITY_FAILED")
    assert fake.cancels == []  # it ended upstream: nothing to cancel
    assert reasons == ["OK", "CAPABILITY_FAILED"]


BAD_QUESTIONS = {
    "too large": a2a_pb2.Part(text="?" * (MAX_PROMPT_BYTES + 1)),
    "no content": a2a_pb2.Part(),
    "bad media type": a2a_pb2.Part(text="which?", media_type="not a media type"),
}


@pytest.mark.parametrize("part", BAD_QUESTIONS.values(), ids=BAD_QUESTIONS.keys())
async def test_a_question_that_cannot_be_passed_on_is_invalid_output(
    pki: Pki, tmp_path: Path, part: a2a_pb2.Part
) -> None:
    asking = task_answer(INPUT_REQUIRED)
    asking.task.status.message.parts.add().CopyFrom(part)
    fake = Scripted([asking])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start"))
            await eventually(lambda: fake.cancels, "the upstream task cancelled")
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "INVALID_OUTPUT")
    assert fake.cancels == [TASK]
    assert reasons == ["INVALID_OUTPUT"]


def _nan() -> a2a_pb2.Part:
    part = a2a_pb2.Part()
    part.data.struct_value.fields["n"].number_value = math.nan
    return part


BAD_PARTS = {
    "no content": a2a_pb2.Part(),
    "bad media type": a2a_pb2.Part(raw=b"x", media_type="text"),
    "unprintable file name": a2a_pb2.Part(raw=b"x", media_type="text/plain", filename="a\nb"),
    "url with a space": a2a_pb2.Part(url="https://example.org/a b"),
    "empty url": a2a_pb2.Part(url=""),
    "NaN": _nan(),
}


@pytest.mark.parametrize("part", BAD_PARTS.values(), ids=BAD_PARTS.keys())
async def test_a_message_answer_with_a_bad_part_is_invalid_output(
    pki: Pki, tmp_path: Path, part: a2a_pb2.Part
) -> None:
    fake = Scripted([message_answer(a2a_pb2.Part(text="fine"), part)])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start"))
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "INVALID_OUTPUT")
    assert fake.cancels == []  # a Message: no upstream task
    assert reasons == ["INVALID_OUTPUT"]


async def test_a_message_answer_without_parts_is_invalid_output(pki: Pki, tmp_path: Path) -> None:
    fake = Scripted([message_answer()])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start"))
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "INVALID_OUTPUT")
    assert reasons == ["INVALID_OUTPUT"]


async def test_parts_over_the_callers_cap_are_output_too_large(pki: Pki, tmp_path: Path) -> None:
    fake = Scripted([task_answer(COMPLETED, a2a_pb2.Part(text="x" * CAP))])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start"))
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "OUTPUT_TOO_LARGE")
    assert not answer.task.artifacts
    assert reasons == ["OUTPUT_TOO_LARGE"]


async def test_more_parts_than_are_read_is_invalid_output(pki: Pki, tmp_path: Path) -> None:
    many = [a2a_pb2.Part(text="") for _ in range(MAX_ANSWER_PARTS + 1)]
    fake = Scripted([task_answer(COMPLETED, *many)])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start"))
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "INVALID_OUTPUT")
    assert reasons == ["INVALID_OUTPUT"]


async def test_a_part_the_skill_does_not_give_is_invalid_output(pki: Pki, tmp_path: Path) -> None:
    pdf = a2a_pb2.Part(raw=b"%PDF", media_type="application/pdf")
    fake = Scripted([message_answer(a2a_pb2.Part(text="see attached"), pdf)])
    async with fronting(pki, tmp_path, fake) as bob:
        async with A2APeer(pki, bob, "alice") as alice:
            answer = await send(alice, message("start", capability="talk.words"))
            reasons = await audited(bob)
    assert ended(answer) == ("TASK_STATE_FAILED", "INVALID_OUTPUT")
    assert reasons == ["INVALID_OUTPUT"]
