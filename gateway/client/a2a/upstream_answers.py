"""Whether an upstream's answer is an A2A answer at all, checked before the SDK reads it.

An answer that is not one (bytes that are no protobuf message, a message
larger than the ceiling, a JSON-RPC body that is no response object, a
``result`` that is no ``SendMessageResponse`` object) raises
``UnreadableAnswer``, which the upstream client reports as INVALID_OUTPUT.
An answer that *is* one, but an error or an unfinished task, is left to the
SDK and reported as CAPABILITY_FAILED.

The checks run on what arrived, by type and shape, so they do not depend on
the SDK's wording of its own errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
from a2a.types import SendMessageRequest, SendMessageResponse
from grpc import aio

_PAYLOADS = ("task", "message")
SEND_MESSAGE = "SendMessage"
# gRPC core's own status for a message over the channel's receive limit. An
# upstream could send this text itself; it then earns INVALID_OUTPUT instead of
# CAPABILITY_FAILED, and both say that the call reached it and may have run.
_TOO_LARGE = "Received message larger than max"


class UnreadableAnswer(Exception):
    """The upstream answered something that is not an A2A answer (never payload content)."""


def check_jsonrpc_answer(body: bytes) -> dict[str, Any]:
    """``body`` parsed, once checked to be a JSON-RPC response object holding an A2A result
    or an error (the transport hands the parsed object on, so it is parsed once).

    A result is a ``SendMessage`` answer (an object holding a task or a
    message) or a task itself (what ``GetTask`` and ``CancelTask`` answer while
    a long-running task is followed): told apart by shape, so our own request
    need not be read again.

    Raises:
        UnreadableAnswer: not JSON, not an object, an ``error`` that is not an
            object, or (without one) a ``result`` that is neither.
    """
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError) as err:  # RecursionError: nesting bombs
        raise UnreadableAnswer("the upstream's answer is not JSON") from err
    if not isinstance(answer, dict):
        raise UnreadableAnswer("the upstream's answer is not a JSON-RPC response object")
    error = answer.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise UnreadableAnswer("the upstream's JSON-RPC error is not an object")
        return answer
    result = answer.get("result")
    if not (_is_send_message_result(result) or _is_task(result)):
        raise UnreadableAnswer("the upstream's JSON-RPC result is not an A2A answer")
    return answer


def _is_send_message_result(result: Any) -> bool:
    if not isinstance(result, dict):
        return False
    return any(isinstance(result.get(kind), dict) for kind in _PAYLOADS)


def _is_task(result: Any) -> bool:
    return (
        isinstance(result, dict)
        and isinstance(result.get("id"), str)
        and isinstance(result.get("status"), dict)
    )


class AnswerCheck(aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Checks every ``SendMessage`` answer on an upstream's gRPC channel.

    gRPC hands the SDK ``None`` when the bytes do not parse (and logs the
    error); the SDK then fails on an attribute. Here such an answer, one
    holding neither a task nor a message, or one over the channel's size
    limit, raises ``UnreadableAnswer`` instead.
    """

    async def intercept_unary_unary(
        self,
        continuation: Callable[[aio.ClientCallDetails, SendMessageRequest], Any],
        client_call_details: aio.ClientCallDetails,
        request: SendMessageRequest,
    ) -> Any:
        """Make the call; return its answer or raise ``UnreadableAnswer``."""
        call = await continuation(client_call_details, request)
        try:
            answer = await call
        except aio.AioRpcError as err:
            if too_large(err):
                raise UnreadableAnswer("the upstream's answer exceeds the size limit") from err
            raise
        method = client_call_details.method
        name = (method.decode() if isinstance(method, bytes) else str(method)).rsplit("/", 1)[-1]
        if name != SEND_MESSAGE:  # GetTask / CancelTask while a task is followed
            if answer is None:
                raise UnreadableAnswer(f"the upstream's answer is not a {name} response")
            return answer
        return checked_send_answer(answer)


def too_large(err: aio.AioRpcError) -> bool:
    """True if gRPC refused an answer over the channel's receive limit."""
    return err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE in (err.details() or "")


def checked_send_answer(answer: object) -> SendMessageResponse:
    """``answer`` if it is a ``SendMessage`` response holding a task or a message.

    Raises:
        UnreadableAnswer: it is not (None: the bytes did not parse).
    """
    if not isinstance(answer, SendMessageResponse) or answer.WhichOneof("payload") not in (
        _PAYLOADS
    ):
        raise UnreadableAnswer("the upstream's answer is not a SendMessage response")
    return answer
