"""Hostile upstreams on the paths that follow an upstream task: streamed, polled, cancelled.

bob fronts a scripted gRPC A2A agent (a servicer of the test's own: any
stream, any stall) or a bare HTTP server; alice calls bob streamed (A2A
``SendStreamingMessage``) or blocking (a2agw.v1 ``Invoke``). Each test checks
alice's outcome and reason, bob's audit record, what reached the upstream
(its ``CancelTask``, the end of its stream), that bob gave back the call's
in-flight slot, and that bob keeps serving.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from gateway.errors import CapabilityTimeout, GatewayError, InvalidOutput
from gateway.transport.tls import MESSAGE_CEILING
from tests.helpers.a2a_hostile_upstream import (
    COMPLETED,
    TASK,
    WORKING,
    RawHttpUpstream,
    Scripted,
    artifact_event,
    audited,
    completed_answer,
    data,
    ending,
    eventually,
    http_response,
    jsonrpc_body,
    raw_http_upstream,
    scripted_grpc_upstream,
    status_event,
    still_serving,
    stream_from,
    task_event,
)
from tests.helpers.agents import Pki
from tests.helpers.fronting import LEGACY, client, fronted

BIG = 2 * 1024 * 1024  # three artifacts of this are over the ceiling, two are not
assert 2 * BIG < MESSAGE_CEILING < 3 * BIG


def message_event(text: str) -> a2a_pb2.StreamResponse:
    event = a2a_pb2.StreamResponse()
    event.message.message_id, event.message.role = "m", a2a_pb2.ROLE_AGENT
    event.message.parts.add(text=text)
    return event


def streaming(address: str) -> dict[str, Any]:
    return {"id": LEGACY, "binding": "grpc", "address": address, "streaming": True}


def output(seen: list[a2a_pb2.StreamResponse]) -> Any:
    updates = [e for e in seen if e.WhichOneof("payload") == "artifact_update"]
    return json_format.MessageToDict(updates[-1].artifact_update.artifact.parts[0].data)


# --- artifacts of task events count against the ceiling -----------------------------


async def test_artifacts_carried_in_task_events_count_against_the_ceiling(
    pki: Pki, tmp_path: Path
) -> None:
    events = [task_event(WORKING, {f"a{n}": str(n) * BIG}) for n in range(3)]
    fake = Scripted(stream=[*events, status_event(COMPLETED)])
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, streaming(address), timeout=30.0) as bob:
            seen, broke = await stream_from(pki, bob)
            assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "INVALID_OUTPUT"))
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            await eventually(lambda: fake.open_streams == 0, "the upstream stream ended")
            # A task event replaces its artifacts' parts: the same id, never over the ceiling.
            same = [task_event(WORKING, {"a": str(n) * BIG}) for n in range(3)]
            fake.stream = [*same, task_event(WORKING, {"a": "last"}), status_event(COMPLETED)]
            replaced, _ = await stream_from(pki, bob)
            again = await still_serving(pki, bob)
            rows = await audited(bob)
    assert (ending(replaced), output(replaced)) == (("TASK_STATE_COMPLETED", ""), {"text": "last"})
    assert again == {"text": "fine"}
    assert rows == [("INVALID_OUTPUT", ""), ("OK", ""), ("OK", "")]


# --- an upstream that never answers CancelTask does not delay the timeout ------------


@pytest.mark.slow
async def test_a_polled_task_times_out_at_the_timeout_though_cancel_task_never_answers(
    pki: Pki, tmp_path: Path
) -> None:
    fake = Scripted(stall_cancel=True)
    fake.answer.task.status.state = WORKING
    async with scripted_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up, timeout=0.5) as bob:
            async with client(pki, bob) as peer:
                with pytest.raises(GatewayError) as caught:
                    # The caller's deadline falls before the old wait for CancelTask ended.
                    await peer.invoke("legacy.echo", {"text": "hi"}, timeout=1.5)
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            fake.answer = completed_answer()
            again = await still_serving(pki, bob)
            rows = await audited(bob)
        # bob's stop did not leave the CancelTask running past it.
        await eventually(lambda: fake.given_up_cancels == 1, "the stalled CancelTask given up")
    assert isinstance(caught.value, CapabilityTimeout)
    assert again == {"text": "fine"}
    assert rows == [("CAPABILITY_TIMEOUT", ""), ("OK", "")]


@pytest.mark.slow
async def test_a_streamed_task_times_out_at_the_timeout_though_cancel_task_never_answers(
    pki: Pki, tmp_path: Path
) -> None:
    fake = Scripted(stream=[task_event(WORKING)], stall_cancel=True)
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, streaming(address), timeout=0.5) as bob:
            seen, broke = await stream_from(pki, bob, deadline=1.5)
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            await eventually(lambda: fake.open_streams == 0, "the upstream stream ended")
            again = await still_serving(pki, bob)
            rows = await audited(bob)
        await eventually(lambda: fake.given_up_cancels == 1, "the stalled CancelTask given up")
    assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "CAPABILITY_TIMEOUT"))
    assert again == {"text": "fine"}
    assert rows == [("CAPABILITY_TIMEOUT", ""), ("OK", "")]


# --- chunks over the caller's cap: the gateway's own error, the upstream cancelled ---


async def test_chunks_over_the_callers_cap_fail_as_a_local_capability_and_cancel_upstream(
    pki: Pki, tmp_path: Path
) -> None:
    chunk = a2a_pb2.Part(text="k" * 200)  # {"text": ...}: 211 bytes; alice's cap is 256
    chunks = [artifact_event(chunk, append=n > 0, last=False) for n in range(3)]
    fake = Scripted(stream=[task_event(WORKING), *chunks, status_event(COMPLETED)])
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, streaming(address), timeout=30.0) as bob:
            seen, broke = await stream_from(pki, bob)
            rows = await audited(bob)
            # As for a local capability's chunks over the cap (test_a2a_long_tasks).
            assert rows == [("CAPABILITY_FAILED", "OUTPUT_TOO_LARGE")]
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            await eventually(lambda: fake.open_streams == 0, "the upstream stream ended")
            again = await still_serving(pki, bob)
            rows = await audited(bob)
    assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "CAPABILITY_FAILED"))
    assert again == {"text": "fine"}
    assert rows == [("CAPABILITY_FAILED", "OUTPUT_TOO_LARGE"), ("OK", "")]


# --- upstream streams end as soon as the gateway stops reading them ------------------

ENDINGS = {
    "a completed task": [
        task_event(WORKING),
        artifact_event(a2a_pb2.Part(text="done"), append=False, last=True),
        status_event(COMPLETED),
    ],
    "a message": [message_event("done")],
}


@pytest.mark.parametrize("stream", ENDINGS.values(), ids=ENDINGS.keys())
async def test_an_upstream_stream_left_open_ends_when_the_answer_is_read(
    pki: Pki, tmp_path: Path, stream: list[a2a_pb2.StreamResponse]
) -> None:
    fake = Scripted(stream=stream)
    # One stream at a time: a stream left open would hold every later call.
    one_stream = (("grpc.max_concurrent_streams", 1),)
    async with scripted_grpc_upstream(fake, pki, options=one_stream) as address:
        async with fronted(pki, tmp_path, streaming(address), timeout=30.0) as bob:
            answers = []
            for _ in range(3):
                seen, broke = await stream_from(pki, bob)
                answers.append((broke, ending(seen), output(seen)))
                await eventually(lambda: fake.open_streams == 0, "the upstream stream ended")
            again = await still_serving(pki, bob)
            rows = await audited(bob)
    assert answers == [("", ("TASK_STATE_COMPLETED", ""), {"text": "done"})] * 3
    assert again == {"text": "fine"}
    assert fake.cancels == []  # the task ended: nothing to cancel
    assert rows == [("OK", "")] * 4


# --- JSON-RPC: a stream only for a streaming call, read only as both sides read it ---


def unfinished(content_type: str) -> Callable[[object], bytes]:
    """A 2xx answer announcing 20 MiB, of which only the start is ever sent."""

    def answer(request_id: object) -> bytes:
        start = jsonrpc_body(request_id, result={"message": {"parts": [{"text": " " * 65536}]}})
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {20 * 1024 * 1024}\r\n\r\n"
        )
        return head.encode("latin-1") + start[: len(start) // 2]

    return answer


@pytest.mark.parametrize(
    "content_type",
    [
        "text/event-stream",
        "text/event-stream; charset=utf-8",
        "application/json; profile=text/event-stream",
    ],
)
async def test_a_stream_answering_a_blocking_call_is_invalid_output_unread(
    pki: Pki, tmp_path: Path, content_type: str
) -> None:
    fake = RawHttpUpstream(unfinished(content_type), hold_open=True)
    async with raw_http_upstream(fake) as url:
        up = {"binding": "jsonrpc", "url": url}
        async with fronted(pki, tmp_path, up, timeout=2.0) as bob, client(pki, bob) as peer:
            # Refused at its headers: the body, never finished, is not waited for.
            with pytest.raises(InvalidOutput):
                await peer.invoke("legacy.echo", {"text": "hi"})
            rows = await audited(bob)
    assert rows == [("INVALID_OUTPUT", "")]
    assert fake.received == 1


def _hidden_event_in_json(request_id: object) -> bytes:
    # One JSON answer to a check that reads the media type (application/json), but
    # SSE to the SDK, which looks for text/event-stream anywhere in the header: its
    # line reader ends lines at U+2028, so a line of the string becomes an event.
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}},
        "pad": "\u2028data: [1, 2, 3]\u2028\u2028",
    }
    raw = json.dumps(body, ensure_ascii=False).encode()
    return http_response(
        raw, headers={"Content-Type": "application/json; profile=text/event-stream"}
    )


def _task_in_json(request_id: object) -> bytes:
    # A GetTask answer, not a stream event: the SDK would parse it as an empty one.
    task = {"id": TASK, "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}
    return http_response(jsonrpc_body(request_id, result=task))


@pytest.mark.parametrize(
    "answer",
    [_hidden_event_in_json, _task_in_json],
    ids=["SSE to the SDK only", "one JSON body that is no stream event"],
)
async def test_a_streaming_answer_the_sdk_would_read_otherwise_is_invalid_output(
    pki: Pki, tmp_path: Path, answer: Callable[[object], bytes]
) -> None:
    fake = RawHttpUpstream(answer)
    async with raw_http_upstream(fake) as url:
        up = {"binding": "jsonrpc", "url": url, "streaming": True}
        async with fronted(pki, tmp_path, up, timeout=5.0) as bob:
            seen, broke = await stream_from(pki, bob)
            await eventually(lambda: bob.limit_stats().in_flight_total == 0, "slot given back")
            rows = await audited(bob)
    assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "INVALID_OUTPUT"))
    assert rows == [("INVALID_OUTPUT", "")]
    assert fake.received == 1


# --- numbers JSON cannot carry are no readable answer ---------------------------------

NOT_JSON_NUMBERS = {"NaN": math.nan, "infinity": math.inf}


def _search_answer(number: float) -> dict[str, Any]:
    return {"hits": ["h"], "seen": {"query": "q", "limit": number}}


@pytest.mark.parametrize("number", NOT_JSON_NUMBERS.values(), ids=NOT_JSON_NUMBERS.keys())
@pytest.mark.parametrize("binding", ["grpc", "jsonrpc"])
async def test_an_answer_holding_a_number_json_cannot_carry_is_invalid_output(
    pki: Pki, tmp_path: Path, binding: str, number: float
) -> None:
    answer = a2a_pb2.SendMessageResponse()
    answer.message.message_id, answer.message.role = "m", a2a_pb2.ROLE_AGENT
    answer.message.parts.add().CopyFrom(data(_search_answer(number)))
    fake = Scripted(answer=answer)
    parts = [{"data": _search_answer(number)}]  # json.dumps writes NaN, Infinity
    result = {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": parts}}
    raw = RawHttpUpstream(lambda rid: http_response(jsonrpc_body(rid, result=result)))
    async with scripted_grpc_upstream(fake, pki) as address, raw_http_upstream(raw) as url:
        up = (
            {"id": LEGACY, "binding": "grpc", "address": address}
            if binding == "grpc"
            else {"binding": "jsonrpc", "url": url}
        )
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            with pytest.raises(InvalidOutput):
                await peer.invoke("legacy.search", {"query": "q"})
            rows = await audited(bob)
    assert rows == [("INVALID_OUTPUT", "")]


async def test_a_streamed_chunk_holding_nan_is_invalid_output_and_cancels_upstream(
    pki: Pki, tmp_path: Path
) -> None:
    chunk = artifact_event(data({"n": math.nan}), append=False, last=False)
    fake = Scripted(stream=[task_event(WORKING), chunk, status_event(COMPLETED)])
    async with scripted_grpc_upstream(fake, pki) as address:
        async with fronted(pki, tmp_path, streaming(address), timeout=30.0) as bob:
            seen, broke = await stream_from(pki, bob)
            assert (broke, ending(seen)) == ("", ("TASK_STATE_FAILED", "INVALID_OUTPUT"))
            await eventually(lambda: fake.cancels == [TASK], "the upstream task cancelled")
            await eventually(lambda: fake.open_streams == 0, "the upstream stream ended")
            again = await still_serving(pki, bob)
            rows = await audited(bob)
    assert [e.WhichOneof("payload") for e in seen].count("artifact_update") == 0  # no chunk
    assert again == {"text": "fine"}
    assert rows == [("INVALID_OUTPUT", ""), ("OK", "")]
