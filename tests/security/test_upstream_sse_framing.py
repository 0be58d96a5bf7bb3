"""A JSON-RPC upstream's SSE stream framed so the SDK and the checker see other events.

The SDK parses an upstream's stream with httpx's line reader, which ends a
line at CR, LF, CRLF and every other ``str.splitlines`` break, in the text
decoded by the stream's charset. ``upstream_sse`` checked lines ended by LF
only: ``: x\\rdata: {...}\\r\\r`` was a comment to it and an event to the SDK,
which then took an event nobody had checked. Now the checker ends lines where
the SDK does, and a stream in a charset other than UTF-8 is refused.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client.transports.http_helpers import parse_sse_stream
from a2a.types import a2a_pb2

from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_sse import CheckedEventStream
from tests.helpers.a2a_grpc import V1, A2APeer, data_request
from tests.helpers.a2a_upstream import SdkAgent, jsonrpc_upstream
from tests.helpers.agents import Pki, spiffe
from tests.helpers.fronting import LEGACY, fronted, outcome, records

BREAKS = [b"\n", b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e"]
BREAKS += ["\x85".encode(), "\u2028".encode(), "\u2029".encode()]
WORKING: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "result": {"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}},
}
NOT_A2A = {"jsonrpc": "2.0", "id": 1, "result": {"oops": {}}}
COMPLETED: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "result": {
        "task": {
            "id": "t",
            "contextId": "c",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a", "parts": [{"text": "echo: x"}]}],
        }
    },
}


def event(body: object, end: bytes = b"\n") -> bytes:
    return b"data: " + json.dumps(body).encode() + end + end


def hidden(body: object, end: bytes) -> bytes:
    """``body`` as an event after a comment, every line ended by ``end`` (then an LF)."""
    return b": x" + end + event(body, end) + b"\n"


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def sdk_events(chunks: list[bytes]) -> tuple[list[str], bool]:
    """The events the SDK's own SSE parser read through the checker, and whether it cut them."""
    response = httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        stream=CheckedEventStream(Chunks(chunks)),
    )
    seen: list[str] = []
    try:
        async for _, data in parse_sse_stream(response):
            seen.append(data)
    except UnreadableAnswer:
        return seen, True
    return seen, False


@pytest.mark.parametrize("end", BREAKS, ids=repr)
@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
async def test_no_event_reaches_the_sdk_unchecked_whatever_ends_its_lines(
    end: bytes, bytewise: bool
) -> None:
    body = event(WORKING) + hidden(NOT_A2A, end) + event(COMPLETED)
    chunks = [body[i : i + 1] for i in range(len(body))] if bytewise else [body]
    seen, cut = await sdk_events(chunks)
    assert cut
    # Cut before the hidden event reached the SDK (a whole chunk: before any of it).
    assert [json.loads(data) for data in seen] == ([WORKING] if bytewise else [])


@pytest.mark.parametrize("end", BREAKS, ids=repr)
@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
async def test_a_well_formed_stream_passes_whatever_ends_its_lines(
    end: bytes, bytewise: bool
) -> None:
    body = event(WORKING, end) + b": ping" + end + end + event(COMPLETED, end)
    chunks = [body[i : i + 1] for i in range(len(body))] if bytewise else [body]
    seen, cut = await sdk_events(chunks)
    assert not cut
    assert [json.loads(data) for data in seen] == [WORKING, COMPLETED]


async def streamed_outcome(
    pki: Pki, tmp_path: Path, stream: list[bytes], sse_type: str = "text/event-stream"
) -> tuple[a2a_pb2.TaskStatus, list[Any]]:
    async with jsonrpc_upstream(SdkAgent(), pki, "legacy", sse=stream, sse_type=sse_type) as url:
        up = {"id": LEGACY, "binding": "jsonrpc", "url": url, "streaming": True}
        async with fronted(pki, tmp_path, up, timeout=30.0) as bob:
            async with A2APeer(pki, bob, "alice") as alice:
                call = alice.stub.SendStreamingMessage(
                    data_request("legacy.echo", {"text": "x"}), metadata=V1, timeout=30
                )
                seen = [event async for event in call]
            rows = await records(bob)
    return seen[-1].status_update.status, rows


@pytest.mark.parametrize("end", [b"\r", "\u2028".encode()], ids=repr)
async def test_a_fronted_stream_with_a_hidden_event_is_invalid_output(
    pki: Pki, tmp_path: Path, end: bytes
) -> None:
    stream = [event(WORKING), hidden(NOT_A2A, end), event(COMPLETED)]
    last, rows = await streamed_outcome(pki, tmp_path, stream)
    assert last.state == a2a_pb2.TASK_STATE_FAILED
    assert last.message.metadata["a2agw.reason"] == "INVALID_OUTPUT"
    assert [outcome(r) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "INVALID_OUTPUT")
    ]


async def test_a_fronted_stream_in_another_charset_is_invalid_output(
    pki: Pki, tmp_path: Path
) -> None:
    # UTF-16: the checker would read other bytes than the events the SDK decodes.
    body = (event(WORKING) + event(COMPLETED)).decode().encode("utf-16-le")
    last, rows = await streamed_outcome(
        pki, tmp_path, [body], sse_type="text/event-stream; charset=utf-16-le"
    )
    assert last.state == a2a_pb2.TASK_STATE_FAILED
    assert last.message.metadata["a2agw.reason"] == "INVALID_OUTPUT"
    assert [outcome(r) for r in rows] == [
        (spiffe("alice"), "legacy.echo", "allow", "INVALID_OUTPUT")
    ]
