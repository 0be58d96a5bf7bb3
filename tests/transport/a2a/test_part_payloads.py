"""Data parts become plain JSON values exactly as ``json_format`` would make them, only faster."""

from __future__ import annotations

import math
from typing import Any

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format, struct_pb2

from capabilities.builtin.echo import EchoInput
from gateway.client.a2a.upstream_parts import data_part, first_data
from gateway.errors import InvalidRequest
from gateway.server.a2a.task_store.store import TaskOutcome
from gateway.server.a2a.task_view import output_artifact, task_message
from gateway.transport.a2a.part_payloads import MessageParts, plain_json
from tests.helpers.a2a_grpc import a2a_task

VALUES: list[Any] = [
    {"a": 1, "b": [1, 2.5, None, True, False, "s", {"c": {}}], "d": {"e": []}},
    {"": 'é\u0000 "q" ✓', "neg": -0.0, "big": 1e300, "small": 5e-324},
    {"deep": {"l": [[[{"x": [None]}]]]}},
    {},
]


def _value(obj: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    json_format.ParseDict(obj, value)
    return value


@pytest.mark.parametrize("obj", VALUES)
def test_plain_json_is_what_message_to_dict_makes(obj: Any) -> None:
    value = _value(obj)
    plain = plain_json(value)
    expected = json_format.MessageToDict(value)
    assert plain == expected
    assert repr(plain) == repr(expected)  # the same types too (numbers stay floats)


def test_an_unset_value_is_null() -> None:
    assert plain_json(struct_pb2.Value()) is None


@pytest.mark.parametrize("number", [math.inf, -math.inf, math.nan])
def test_numbers_json_cannot_carry_are_refused(number: float) -> None:
    value = struct_pb2.Value()
    value.struct_value.update({"text": "x", "n": [number]})
    with pytest.raises(ValueError):
        plain_json(value)
    with pytest.raises(InvalidRequest) as refused:
        MessageParts([a2a_pb2.Part(data=value)]).decode(EchoInput)
    assert refused.value.reason == "INVALID_REQUEST"


def test_a_data_part_decodes_to_compact_sorted_json() -> None:
    value = _value({"text": "hi", "a": 1})
    assert MessageParts([a2a_pb2.Part(data=value)]).decode(EchoInput) == b'{"a":1.0,"text":"hi"}'


def test_a_fronted_data_part_is_the_value_parse_dict_makes() -> None:
    payload = EchoInput(text="héllo")
    part = data_part(payload)
    assert part.media_type == "application/json"
    assert part.data == _value({"text": "héllo"})
    assert first_data([a2a_pb2.Part(text="t"), part]) == {"text": "héllo"}


def test_the_output_artifact_is_the_same_in_a_task_and_on_its_own() -> None:
    task = a2a_task(
        "t-1",
        "spiffe://example.org/agent/alice",
        "text.echo",
        context_id="c-1",
        state=TaskOutcome.COMPLETED,
        output=b'{"text":"' + b"x" * 70000 + b'"}',
        evidence_sha256="ab" * 32,
        reason="OK",
        created_ms=1,
        updated_ms=2,
    )
    artifact = output_artifact(task)
    assert task_message(task).artifacts == [artifact]
    assert artifact.artifact_id == "t-1-output" and artifact.name == "text.echo"
    assert json_format.MessageToDict(artifact.parts[0].data) == {"text": "x" * 70000}
    assert dict(artifact.metadata) == {
        "a2agw.served_version": "1.0.0",
        "a2agw.evidence_sha256": "ab" * 32,
        "a2agw.replayed": False,
    }
