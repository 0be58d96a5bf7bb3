"""Probe: an upstream's answer that leaves out an optional object of its output schema.

An ``output_schema`` may declare an optional nested object (``seen`` in the
fronted ``legacy.search``). An upstream answer without it is within the contract,
but serialising the validated output raised ``PydanticSerializationError`` (the
schema model's serializer was handed the absent object's ``None``): the caller got
gRPC ``UNKNOWN`` carrying the exception's text, and bob wrote no audit record.
The same answer over A2A never finished its task cleanly either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import a2a_pb2

from tests.helpers.a2a_grpc import V1, A2APeer, data_request, output_of
from tests.helpers.a2a_hostile_upstream import Scripted, data, scripted_grpc_upstream
from tests.helpers.agents import spiffe
from tests.helpers.fronting import LEGACY, client, fronted, outcome, records


def _answer(value: dict[str, Any]) -> a2a_pb2.SendMessageResponse:
    answer = a2a_pb2.SendMessageResponse()
    answer.message.message_id, answer.message.role = "m", a2a_pb2.ROLE_AGENT
    answer.message.parts.add().CopyFrom(data(value))
    return answer


async def test_an_answer_without_an_optional_object_is_the_output(pki: Any, tmp_path: Path) -> None:
    fake = Scripted(answer=_answer({"hits": ["a", "b"]}))  # "seen" (optional object) absent
    async with scripted_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob:
            async with client(pki, bob) as peer:
                result = await peer.invoke("legacy.search", {"query": "q"})
            rows = await records(bob)
    assert result.output() == {"hits": ["a", "b"]}
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.search", "allow", "OK")]


async def test_over_a2a_the_same_answer_completes_the_task(pki: Any, tmp_path: Path) -> None:
    fake = Scripted(answer=_answer({"hits": ["a"]}))
    async with scripted_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob:
            async with A2APeer(pki, bob, "alice") as alice:
                try:
                    task = await alice.stub.SendMessage(
                        data_request("legacy.search", {"query": "q"}), metadata=V1, timeout=10
                    )
                except grpc.aio.AioRpcError as err:  # before the fix: UNKNOWN
                    pytest.fail(f"SendMessage answered {err.code().name}")
            rows = await records(bob)
    assert task.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    assert output_of(task.task) == {"hits": ["a"]}
    assert [outcome(r) for r in rows] == [(spiffe("alice"), "legacy.search", "allow", "OK")]
