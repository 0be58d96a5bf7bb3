"""An upstream's gRPC server streams, cancelled as soon as the gateway stops reading them.

The a2a-sdk reads a server stream (``SendStreamingMessage``) through a chain
of async generators and never cancels the gRPC call when they are left early
or closed: the call stays open on the upstream until its deadline (the
skill's timeout and a margin), even after a complete answer, and holds one of
the upstream's concurrent streams meanwhile (an upstream allowing four is
blocked after four calls). Garbage collection does not end it either: gRPC's
own done callbacks keep the call referenced until it finishes.

So the channel carries ``StreamCalls``, which records each server-streaming
call started inside :func:`cancelled_on_exit`, and leaving that block cancels
them (a finished call is left as it is). The calls are found through a
context variable: each capability call runs in its own task, so concurrent
calls never see each other's streams. JSON-RPC streams need none of this: the
SDK closes their HTTP response when its generator is closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from grpc import aio


class _Started:
    """The calls started in one ``cancelled_on_exit`` block; one started after it ended
    (its interceptor ran late) is cancelled at once."""

    __slots__ = ("_calls", "_ended")

    def __init__(self) -> None:
        self._calls: list[Any] = []
        self._ended = False

    def add(self, call: Any) -> None:
        if self._ended:
            call.cancel()
        else:
            self._calls.append(call)

    def cancel_all(self) -> None:
        self._ended = True
        for call in self._calls:
            call.cancel()


_STARTED: ContextVar[_Started | None] = ContextVar("upstream_stream_calls", default=None)
"""The current ``cancelled_on_exit`` block's calls (None: outside one)."""


class StreamCalls(aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Records the server-streaming calls of a ``cancelled_on_exit`` block (see the module doc)."""

    async def intercept_unary_stream(
        self,
        continuation: Callable[[aio.ClientCallDetails, Any], Any],
        client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        """Start the call and record it; it is returned unchanged."""
        call = await continuation(client_call_details, request)
        started = _STARTED.get()
        if started is not None:
            started.add(call)
        return call


@contextlib.contextmanager
def cancelled_on_exit() -> Iterator[None]:
    """Cancel, on leaving the block, every server stream started in it that is still open."""
    started = _Started()
    token = _STARTED.set(started)
    try:
        yield
    finally:
        _STARTED.reset(token)
        started.cancel_all()
