"""An upstream's answer read as parts, replies and questions (``upstream_parts``, ``upstream_replies``)."""

from __future__ import annotations

import math

import pytest
from a2a.types import a2a_pb2

from capabilities.parts import (
    Artifact,
    DataPart,
    FilePart,
    MessageReply,
    Part,
    TaskReply,
    TextPart,
    UrlPart,
)
from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_parts import MAX_ANSWER_PARTS, fill_wire_part, typed_parts
from gateway.client.a2a.upstream_replies import (
    MAX_PROMPT_BYTES,
    SILENT_QUESTION,
    STATUS_ARTIFACT,
    UpstreamAnswer,
)

PARTS: tuple[Part, ...] = (
    TextPart("hi"),
    TextPart("# title", "text/markdown"),
    DataPart({"k": "v", "n": [1.0, None]}),
    DataPart(["not", "an", "object"]),
    FilePart(b"\x00bytes", "application/pdf", "a.pdf"),
    FilePart(b"", "text/plain"),
    UrlPart("https://example.org/a?b=c", "image/png", "a.png"),
    UrlPart("s3://bucket/key"),
)


def wire(parts: tuple[Part, ...]) -> list[a2a_pb2.Part]:
    made = []
    for part in parts:
        target = a2a_pb2.Part()
        fill_wire_part(target, part)
        made.append(target)
    return made


def test_parts_go_to_the_wire_and_come_back_the_same() -> None:
    assert typed_parts(wire(PARTS)) == PARTS
    assert wire((TextPart("hi"),))[0] == a2a_pb2.Part(text="hi")  # no media type for plain text
    assert wire((DataPart({"a": 1}),))[0].media_type == "application/json"


def test_a_file_without_a_media_type_is_octet_stream() -> None:
    assert typed_parts([a2a_pb2.Part(raw=b"x")]) == (FilePart(b"x", "application/octet-stream"),)


def _nan() -> a2a_pb2.Part:
    part = a2a_pb2.Part()
    part.data.number_value = math.nan
    return part


@pytest.mark.parametrize(
    "part",
    [
        a2a_pb2.Part(),
        a2a_pb2.Part(text="x", media_type="plain"),
        a2a_pb2.Part(raw=b"x", media_type="text/plain", filename="a\x00b"),
        a2a_pb2.Part(url="https://example.org/a b"),
        a2a_pb2.Part(url="x" * 9000),
        _nan(),
    ],
    ids=["empty", "media type", "file name", "url space", "url length", "NaN"],
)
def test_a_malformed_part_is_unreadable(part: a2a_pb2.Part) -> None:
    with pytest.raises(UnreadableAnswer):
        typed_parts([a2a_pb2.Part(text="fine"), part])


def message_event(parts: list[a2a_pb2.Part]) -> a2a_pb2.StreamResponse:
    event = a2a_pb2.StreamResponse()
    event.message.message_id, event.message.context_id = "r", "c-up"
    for part in parts:
        event.message.parts.add().CopyFrom(part)
    return event


def task_event(state: int, status: list[a2a_pb2.Part]) -> a2a_pb2.StreamResponse:
    event = a2a_pb2.StreamResponse()
    task = event.task
    task.id, task.context_id = "t", "c-up"
    task.status.state = state  # type: ignore[assignment]
    for part in status:
        task.status.message.parts.add().CopyFrom(part)
    return event


def test_a_message_is_a_message_reply() -> None:
    answer = UpstreamAnswer(message_event(wire(PARTS)))
    assert (answer.task_id, answer.context_id, answer.asks) == ("", "c-up", None)
    assert answer.reply() == MessageReply(PARTS)


def test_a_completed_task_is_a_task_reply_its_status_text_and_other_status_parts() -> None:
    event = task_event(a2a_pb2.TASK_STATE_COMPLETED, wire((TextPart("all "), TextPart("done"))))
    event.task.status.message.parts.add().CopyFrom(wire((DataPart({"s": 1.0}),))[0])
    first = event.task.artifacts.add(artifact_id="1", name="report", description="the report")
    first.parts.extend(wire(PARTS[:2]))
    event.task.artifacts.add(artifact_id="2").parts.extend(wire(PARTS[6:]))
    answer = UpstreamAnswer(event)
    assert (answer.task_id, answer.asks) == ("t", None)
    assert answer.reply() == TaskReply(
        (
            Artifact(PARTS[:2], "report", "the report"),
            Artifact(PARTS[6:]),
            Artifact((DataPart({"s": 1.0}),), STATUS_ARTIFACT),
        ),
        "all done",
    )
    assert answer.wire_parts() == wire(PARTS[:2]) + wire(PARTS[6:])  # a skill without gives


def test_an_artifact_or_message_without_parts_is_unreadable() -> None:
    with pytest.raises(UnreadableAnswer):
        UpstreamAnswer(message_event([])).reply()
    event = task_event(a2a_pb2.TASK_STATE_COMPLETED, [])
    event.task.artifacts.add(artifact_id="empty")
    with pytest.raises(UnreadableAnswer):
        UpstreamAnswer(event).reply()


def test_more_parts_than_are_read_is_unreadable() -> None:
    too_many = [a2a_pb2.Part(text="")] * (MAX_ANSWER_PARTS + 1)
    with pytest.raises(UnreadableAnswer):
        UpstreamAnswer(message_event(too_many)).reply()


@pytest.mark.parametrize(
    ("state", "asks"),
    [
        (a2a_pb2.TASK_STATE_INPUT_REQUIRED, "input-required"),
        (a2a_pb2.TASK_STATE_AUTH_REQUIRED, "auth-required"),
        (a2a_pb2.TASK_STATE_COMPLETED, None),
    ],
)
def test_a_waiting_task_asks_in_its_state(state: int, asks: str | None) -> None:
    assert UpstreamAnswer(task_event(state, [])).asks == asks


def test_the_question_is_the_status_message() -> None:
    asked = UpstreamAnswer(task_event(a2a_pb2.TASK_STATE_INPUT_REQUIRED, wire(PARTS[:3])))
    assert asked.prompt() == PARTS[:3]
    silent = UpstreamAnswer(task_event(a2a_pb2.TASK_STATE_INPUT_REQUIRED, []))
    assert silent.prompt() == (TextPart(SILENT_QUESTION),)
    huge = wire((TextPart("?" * MAX_PROMPT_BYTES),))
    with pytest.raises(UnreadableAnswer):
        UpstreamAnswer(task_event(a2a_pb2.TASK_STATE_INPUT_REQUIRED, huge)).prompt()
