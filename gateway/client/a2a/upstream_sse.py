"""The SSE stream of a JSON-RPC upstream, checked event by event as it arrives.

A streamed answer (``SendStreamingMessage`` over JSON-RPC) is not read whole
(``upstream_http`` reads every other answer whole): its bytes are handed on
as they come, and each event is checked once its blank line arrives, before
the SDK parses it. Bounds, so an upstream cannot make this agent hold or
parse without limit:

* an event (all its lines) is at most ``MESSAGE_CEILING`` bytes, counted as
  the bytes arrive, before any line is complete;
* the whole stream is at most ``STREAM_CEILING`` bytes (the collected answer
  is capped again in ``upstream_tasks``; the time by the skill's timeout);
* only ``identity`` content coding (no inflating a stream);
* every event's data is a JSON-RPC response object holding an ``error``
  object or a ``result`` with one stream payload (task, message, status or
  artifact update) as an object.

Anything else raises ``UnreadableAnswer`` (INVALID_OUTPUT) and the stream is
cut. A JSON-RPC error in the stream is left to the SDK (CAPABILITY_FAILED).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.transport.tls import MESSAGE_CEILING

STREAM_CEILING = 8 * MESSAGE_CEILING
"""Bytes one upstream stream may carry in all (events of status text and chunks)."""
STREAM_PAYLOADS = ("task", "message", "statusUpdate", "artifactUpdate")
"""The keys of a ``StreamResponse`` in JSON (one of them per event)."""
_LINE_END = re.compile(rb"\r\n|[\n\r\x0b\x0c\x1c-\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
"""Where httpx's line reader (the SDK's SSE parser) ends a line of UTF-8 text."""
_UNFINISHED_END = re.compile(rb"(\r|\xc2|\xe2|\xe2\x80)\Z")
"""A chunk's last bytes that may begin a line end the next chunk completes."""


def is_event_stream(response: httpx.Response) -> bool:
    """The answer is an SSE stream (a 2xx ``text/event-stream``)."""
    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return 200 <= response.status_code < 300 and kind == "text/event-stream"


class CheckedEventStream(httpx.AsyncByteStream):
    """``inner``'s bytes, passed on as they arrive; each event checked (see the module doc)."""

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        *,
        event_limit: int = MESSAGE_CEILING,
        stream_limit: int = STREAM_CEILING,
    ) -> None:
        self._inner = inner
        self._event_limit = event_limit
        self._stream_limit = stream_limit
        self._line = bytearray()
        self._data: list[bytes] = []
        self._event_bytes = 0
        self._total = 0
        self._held = b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._total += len(chunk)
            if self._total > self._stream_limit:
                raise UnreadableAnswer("the upstream's stream exceeds the size limit")
            self._take(chunk)
            yield chunk
        self._take(b"\n\n")  # a last event without its blank line is checked too

    def _take(self, chunk: bytes) -> None:
        # Lines end where the SDK's reader ends them (httpx splits the UTF-8 text
        # as str.splitlines does: CR, LF, CRLF, VT, FF, FS, GS, RS, NEL, LS, PS),
        # or a stream framed otherwise would be events there, unchecked here. A
        # terminator that may continue in the next chunk waits for it.
        chunk = self._held + chunk
        held = _UNFINISHED_END.search(chunk)
        self._held = chunk[held.start() :] if held else b""
        if held:
            chunk = chunk[: held.start()]
        start = 0
        for end in _LINE_END.finditer(chunk):
            self._add(chunk[start : end.start()])
            self._end_line()
            start = end.end()
        self._add(chunk[start:])

    def _add(self, part: bytes) -> None:
        self._event_bytes += len(part)
        if self._event_bytes > self._event_limit:
            raise UnreadableAnswer("an event of the upstream's stream exceeds the size limit")
        self._line += part

    def _end_line(self) -> None:
        line = bytes(self._line).rstrip(b"\r")
        self._line.clear()
        if line:
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            return
        if self._data:  # a blank line ends the event
            check_stream_event(b"\n".join(self._data))
        self._data = []
        self._event_bytes = 0

    async def aclose(self) -> None:
        """Close the inner stream (the connection goes back, or is dropped)."""
        await self._inner.aclose()


def check_stream_event(data: bytes) -> None:
    """Check one event's data: a JSON-RPC response with an error or one stream payload.

    Raises:
        UnreadableAnswer: it is not.
    """
    try:
        answer: Any = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise UnreadableAnswer("an event of the upstream's stream is not JSON") from err
    if not isinstance(answer, dict):
        raise UnreadableAnswer("an event of the upstream's stream is not a JSON-RPC response")
    error = answer.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise UnreadableAnswer("the upstream's JSON-RPC error is not an object")
        return
    result = answer.get("result")
    if (
        not isinstance(result, dict)
        or [isinstance(result.get(k), dict) for k in STREAM_PAYLOADS].count(True) != 1
    ):
        raise UnreadableAnswer("an event of the upstream's stream is not an A2A stream event")
