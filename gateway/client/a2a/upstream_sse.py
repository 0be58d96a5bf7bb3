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

What is a stream is decided so that this check and the SDK's parse always
read the same body the same way (:func:`is_streamed`): the SDK parses an
answer as SSE when its Content-Type holds ``text/event-stream`` anywhere, so
an answer that is a stream to one reading and not to the other
(``application/json; profile=text/event-stream``, ``Text/Event-Stream``) is
refused, and so is a stream answering a call that asked for none (a
non-streaming call reads its answer whole, as JSON).
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
EVENT_STREAM = "text/event-stream"
STREAM_PAYLOADS = ("task", "message", "statusUpdate", "artifactUpdate")
"""The keys of a ``StreamResponse`` in JSON (one of them per event)."""
_LINE_END = re.compile(rb"\r\n|[\n\r\x0b\x0c\x1c-\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
"""Where httpx's line reader (the SDK's SSE parser) ends a line of UTF-8 text."""
_UNFINISHED_END = re.compile(rb"(\r|\xc2|\xe2|\xe2\x80)\Z")
"""A chunk's last bytes that may begin a line end the next chunk completes."""


def asks_for_stream(request: httpx.Request) -> bool:
    """The call asked for an SSE stream (the SDK's streaming calls, and only they,
    send ``Accept: text/event-stream``)."""
    return EVENT_STREAM in request.headers.get("accept", "")


def is_streamed(request: httpx.Request, response: httpx.Response) -> bool:
    """``response`` is an SSE stream to hand on as it comes (False: an answer to read whole).

    A 2xx answer is one when its media type is ``text/event-stream`` and, as
    the SDK tests it, its Content-Type holds that text; only a call that asked
    for a stream may get one.

    Raises:
        UnreadableAnswer: a 2xx answer that is a stream to one of those readings
            and not to the other, or a stream the call did not ask for.
    """
    if not 200 <= response.status_code < 300:
        return False
    header = response.headers.get("content-type", "")
    ours = header.split(";", 1)[0].strip().lower() == EVENT_STREAM
    sdks = EVENT_STREAM in header  # a2a-sdk's send_http_stream_request
    if not ours and not sdks:
        return False
    if ours != sdks:
        raise UnreadableAnswer("the upstream's answer has an ambiguous media type")
    if not asks_for_stream(request):
        raise UnreadableAnswer("the upstream answered a stream to a call that asked for none")
    return True


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


def check_stream_event(data: bytes) -> dict[str, Any]:
    """One event's data, parsed, once checked to be a JSON-RPC response with an error
    or one stream payload (also how a streaming call's answer read whole is checked:
    the SDK parses it as one event).

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
        return answer
    result = answer.get("result")
    if (
        not isinstance(result, dict)
        or [isinstance(result.get(k), dict) for k in STREAM_PAYLOADS].count(True) != 1
    ):
        raise UnreadableAnswer("an event of the upstream's stream is not an A2A stream event")
    return answer
