"""Calls to a gRPC method this agent does not serve: refused, audited, ``UNIMPLEMENTED``.

gRPC answers a method nobody registered with ``UNIMPLEMENTED`` before any code
of ours runs, so a peer probing the port for other services (reflection, an old
or draft A2A package, guessed names) left no audit record, where the HTTPS
port's unknown paths are audited. The last generic handler of the server takes
every method the others did not: the caller passes the same identity prefix as
any request (certificate, known peer, grant, rate and in-flight limits, each
refusal audited as usual), and is then refused ``UNKNOWN_METHOD`` with status
``UNIMPLEMENTED``, its record naming the method (only its first characters,
and only if they are a plain method path).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from gateway.errors import GatewayError, UnknownMethod
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.server.received import peer_cert
from gateway.transport.status import to_grpc_status

OPERATION = "gRPC unknown method"
"""The audit detail's operation for these refusals."""
SHOWN_METHOD_CHARS = 96
_PLAIN_METHOD = re.compile(r"/[A-Za-z0-9_.]{1,200}/[A-Za-z0-9_]{1,200}")


def shown_method(method: str) -> str:
    """The method as the audit record and the answer name it: the plain path cut to
    :data:`SHOWN_METHOD_CHARS`, or ``"(not a method path)"`` for anything else."""
    if not _PLAIN_METHOD.fullmatch(method):
        return "(not a method path)"
    return method[:SHOWN_METHOD_CHARS]


class UnknownMethods(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
    """Registered last: answers every method no other handler serves."""

    def __init__(self, handler: InvokeHandler) -> None:
        self._handler = handler

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """A stream-stream handler (it fits a call of any kind) that refuses the call.

        Requests are never decoded: no deserializer, and none is read.
        """
        method = shown_method(str(handler_call_details.method))

        async def refuse(
            _requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
        ) -> None:
            error: GatewayError
            try:
                peer_id, _ = await self._handler.admit_peer(peer_cert(context), OPERATION)
                error = await self._handler.refuse(
                    peer_id,
                    UnknownMethod(f"no method {method} on this agent", detail=method),
                    OPERATION,
                )
            except GatewayError as refused:  # the identity prefix refused it (audited)
                error = refused
            await context.abort_with_status(to_grpc_status(error))

        return grpc.stream_stream_rpc_method_handler(refuse)
