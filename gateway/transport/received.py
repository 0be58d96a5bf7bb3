"""What every servicer needs from a received call: the peer's certificate, parsed requests.

Both services (``a2agw.v1`` and ``lf.a2a.v1``) register their RPCs with
deserializers that never raise: the generated registration lets a corrupt
message escape as an UNKNOWN status that no audit record sees; here it
reaches the servicer as :class:`MalformedRequest`, to be refused and audited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.message import DecodeError
from grpc import aio


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
