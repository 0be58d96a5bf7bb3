"""The checked SSE stream of a JSON-RPC upstream: events checked as their blank line arrives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_sse import CheckedEventStream, check_stream_event

STATUS = {"jsonrpc": "2.0", "id": 1, "result": {"statusUpdate": {"taskId": "t"}}}


class Chunks(httpx.AsyncByteStream):
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


async def _read(stream: CheckedEventStream) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def test_events_split_anywhere_pass_through_unchanged() -> None:
    body = b"event: message\r\ndata: " + json.dumps(STATUS).encode() + b"\r\n\r\n: ping\n\n"
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]  # lines cut mid-way
    assert await _read(CheckedEventStream(Chunks(*chunks))) == body


async def test_multi_line_data_is_one_event() -> None:
    text = json.dumps(STATUS, indent=1).encode().split(b"\n")
    body = b"".join(b"data: " + line + b"\n" for line in text) + b"\n"
    assert await _read(CheckedEventStream(Chunks(body))) == body


@pytest.mark.parametrize(
    "body",
    [
        b"data: not json\n\n",
        b'data: {"jsonrpc": "2.0", "result": {"task": {}, "message": {}}}\n\n',  # two payloads
        b'data: {"jsonrpc": "2.0", "error": "boom"}\n\n',
        b"data: [1]",  # the last event, without its blank line, is checked at the end
    ],
)
async def test_an_event_that_is_not_a2a_is_unreadable(body: bytes) -> None:
    with pytest.raises(UnreadableAnswer):
        await _read(CheckedEventStream(Chunks(body)))


async def test_an_event_is_cut_at_its_limit_before_its_line_ends() -> None:
    stream = CheckedEventStream(Chunks(b"data: ", b"x" * 50, b"x" * 50), event_limit=64)
    passed = []
    with pytest.raises(UnreadableAnswer, match=r"event .* exceeds"):
        async for chunk in stream:
            passed.append(chunk)
    assert passed == [b"data: ", b"x" * 50]  # the chunk that crossed the limit was not handed on


async def test_the_whole_stream_is_capped() -> None:
    event = b"data: " + json.dumps(STATUS).encode() + b"\n\n"
    stream = CheckedEventStream(Chunks(*[event] * 10), stream_limit=len(event) * 3)
    with pytest.raises(UnreadableAnswer, match="stream exceeds"):
        await _read(stream)


def test_an_error_response_is_left_to_the_sdk() -> None:
    check_stream_event(b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -32001}}')
