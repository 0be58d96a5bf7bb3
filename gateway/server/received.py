"""What every servicer needs from a received call: the peer's certificate, the bearer tokens
beside it, parsed requests, and a registration that does not cost the other services' calls.

Both services (``a2agw.v1`` and ``lf.a2a.v1``) register their RPCs with
deserializers that never raise: the generated registration lets a corrupt
message escape as an UNKNOWN status that no audit record sees; here it
reaches the servicer as :class:`MalformedRequest`, to be refused and audited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from gateway.identity import PresentedTokens, presented_tokens
from gateway.inbound.pipeline import EdgeSlot


class MalformedRequest:
    """Stands in for a request whose bytes did not parse, so it can be refused and audited."""


_MALFORMED = MalformedRequest()


def tolerant(message_class: Any) -> Callable[[bytes], Any]:
    """A request deserializer that returns :class:`MalformedRequest` instead of raising."""

    def deserialize(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError:
            return _MALFORMED

    return deserialize


def peer_cert(context: aio.ServicerContext[Any, Any]) -> bytes | None:
    """The client certificate the TLS handshake verified (None unless exactly one)."""
    auth: Mapping[str, Iterable[bytes]] = context.auth_context()
    certs = list(auth.get("x509_pem_cert", ()))
    return certs[0] if len(certs) == 1 else None


def request_tokens(context: aio.ServicerContext[Any, Any]) -> PresentedTokens | None:
    """The bearer tokens the call presented (``authorization``, ``a2agw-user-token``).

    On gRPC, read from the metadata; a gRPC caller always has a client
    certificate (the handshake requires one), so a token there is only ever
    bound to it. Behind the HTTP edge, the edge's own object for the request
    (``HttpServicerContext.presented_tokens``), verified once for both.
    """
    if hasattr(context, "presented_tokens"):
        tokens = context.presented_tokens
        return tokens if isinstance(tokens, PresentedTokens) else None
    return presented_tokens(context.invocation_metadata() or ())


def edge_slot(context: aio.ServicerContext[Any, Any]) -> EdgeSlot | None:
    """The limit slot the HTTP edge took for this request before reading its body.

    None on gRPC, whose server parses a message (bounded by its maximum message
    size) before any servicer runs: there the pipeline takes the slot itself.
    """
    slot = getattr(context, "edge_slot", None)
    return slot if isinstance(slot, EdgeSlot) else None


class GenericOnly:
    """A server as a service's ``add_..._to_server`` sees it: generic handlers only.

    ``grpc.aio`` keeps one pending request per registered method and waits on
    all of them (``asyncio.wait``) again for every call that arrives, so each
    registered method costs every call, Invoke included: with the A2A and
    health services registered too that was 17 futures instead of 3. Their
    calls are just as well found through their generic handlers (a dict
    lookup by method name), as before registered methods existed.
    """

    def __init__(self, server: aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]
    ) -> None:
        """Passed on to the server."""
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Ignored: the service's generic handler serves these methods."""
        del service_name, method_handlers
