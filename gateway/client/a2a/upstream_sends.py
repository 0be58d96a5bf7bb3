"""A blocking ``SendMessage`` to a gRPC upstream, without the a2a-sdk client.

The one call every fronted message makes goes out on a channel of its own
with no interceptors: a ``grpc.aio`` channel with interceptors runs each
unary call in an extra task, and the SDK client wraps it in its own layers
(its interceptors, a span, a copy into a ``StreamResponse``). The channel is
made by the same function as the SDK client's, with the same credentials and
options, so it pins the same identity and has the same message ceiling;
gRPC core's shared subchannel pool can then serve both on one connection.

The answer is checked as ``upstream_answers.AnswerCheck`` checks the SDK's:
bytes that are no ``SendMessageResponse``, one holding neither a task nor a
message, or one over the ceiling raise ``UnreadableAnswer``. Anything else
gRPC raises is left to the caller to translate, as the SDK's errors are.
"""

from __future__ import annotations

from a2a.types import SendMessageRequest, SendMessageResponse, StreamResponse
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, VERSION_HEADER
from google.protobuf.message import DecodeError
from grpc import aio

from gateway.client.a2a.upstream_answers import UnreadableAnswer, checked_send_answer, too_large

SEND_MESSAGE_METHOD = "/lf.a2a.v1.A2AService/SendMessage"
_METADATA = ((VERSION_HEADER.lower(), PROTOCOL_VERSION_CURRENT),)
"""What the SDK client sends with each call (the protocol version, nothing else)."""


class GrpcSends:
    """``SendMessage`` on one plain channel to an upstream (see the module doc).

    Attributes:
        channel: The channel (close it with the link).
    """

    __slots__ = ("_call", "channel")

    def __init__(self, channel: aio.Channel) -> None:
        self.channel = channel
        self._call = channel.unary_unary(
            SEND_MESSAGE_METHOD,
            request_serializer=SendMessageRequest.SerializeToString,
            response_deserializer=None,  # bytes: parsed and checked below
        )

    async def send(self, request: SendMessageRequest, timeout: float) -> StreamResponse:
        """The upstream's answer to ``request``, as the SDK client's non-streaming
        ``send_message`` yields it (a ``StreamResponse`` holding the task or message).

        Raises:
            UnreadableAnswer: the answer is not a ``SendMessage`` response.
            grpc.aio.AioRpcError: any other failure of the call.
        """
        try:
            body = await self._call(request, metadata=_METADATA, timeout=timeout)
        except aio.AioRpcError as err:
            if too_large(err):
                raise UnreadableAnswer("the upstream's answer exceeds the size limit") from err
            raise
        try:
            answer = checked_send_answer(SendMessageResponse.FromString(body))
        except DecodeError as err:
            raise UnreadableAnswer("the upstream's answer is not a SendMessage response") from err
        event = StreamResponse()
        if answer.HasField("task"):
            event.task.CopyFrom(answer.task)
        else:
            event.message.CopyFrom(answer.message)
        return event
