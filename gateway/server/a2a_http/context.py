"""What an HTTP request looks like to the gRPC A2A servicer: a ``ServicerContext`` stand-in.

The servicer (``gateway.server.a2a.servicer``) reads five things from its
context: the verified client certificate (``auth_context``), the metadata
(``a2a-version``, ``traceparent``), the time left (``time_remaining``), how
to answer an error (``abort_with_status``) and the limit slot the edge took
before reading the body (``edge_slot``, which the pipeline adopts). :class:`HttpServicerContext`
gives it those from one HTTP request, so the servicer's methods — and the one
decision path behind them — serve the HTTP bindings unchanged. An abort
raises :class:`Aborted`, which the request handler turns back into the
GatewayError it carried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from gateway.errors import GatewayError
from gateway.identity import PresentedTokens
from gateway.inbound.pipeline import EdgeSlot

EXCHANGE_KEY = "a2agw.exchange"
"""Where the edge keeps a request's :class:`Exchange` (ASGI scope and call-context state)."""
VERSION_METADATA = "a2a-version"


class Aborted(Exception):
    """The servicer answered with an error status (``abort_with_status``)."""

    def __init__(self, status: grpc.Status) -> None:
        super().__init__(status.details)
        self.status = status


@dataclass(slots=True)
class Exchange:
    """One HTTP request as the edge and the request handler share it.

    Attributes:
        peer_cert_pem: The client certificate the TLS handshake verified (None: none).
        metadata: The request's headers, lowercased, as gRPC metadata pairs.
        operation: The A2A method (for the audit record of a refusal the SDK made).
        peer_id: The caller's SPIFFE ID, once the edge has identified it.
        reached: Set once the request reached the servicer (which audits it).
        refusal: The error the servicer answered with, to be rendered by the edge.
        request_id: The JSON-RPC request id, once the SDK has parsed it.
        slot: The limit slot the edge took before reading the body; the
            pipeline adopts it (``edge_slot``), else the edge gives it back.
        v0_3: The request is A2A 0.3, parsed and translated to 1.0 by the
            a2a-sdk's compat layer (a 0.3 REST path, or a 0.3 JSON-RPC method).
        tokens: The bearer tokens in its headers (None: none, or tokens are
            off); verified once, by the edge, for the servicer too.
    """

    peer_cert_pem: bytes | None
    metadata: tuple[tuple[str, str], ...]
    operation: str
    peer_id: str = ""
    reached: bool = False
    refusal: GatewayError | None = None
    request_id: str | int | None = None
    slot: EdgeSlot | None = None
    v0_3: bool = False
    tokens: PresentedTokens | None = None
    _done: list[Callable[[], None]] = field(default_factory=list)


def claimed_version(metadata: tuple[tuple[str, str], ...]) -> str | None:
    """The ``A2A-Version`` the client sent (None: none)."""
    for key, value in metadata:
        if key == VERSION_METADATA:
            return value.strip()
    return None


def is_v0_3_version(version: str | None) -> bool:
    """True for what a 0.3 client sends: no ``A2A-Version`` or an empty one (the spec's 0.3,
    section 3.6.2: "Agents MUST interpret empty value as 0.3 version"), ``0.3``, ``0.3.x``."""
    return not version or version == "0.3" or version.startswith("0.3.")


def translated_metadata(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The metadata of a 0.3 request once the SDK translated it to 1.0.

    The servicer then sees the version of the request it is given (1.0). A
    version no 0.3 client sends (``0.2``, ``2.0``) stays as sent, so the
    servicer's version check refuses it, audited, as on every binding.
    """
    if not is_v0_3_version(claimed_version(metadata)):
        return metadata
    kept = tuple((key, value) for key, value in metadata if key != VERSION_METADATA)
    return (*kept, (VERSION_METADATA, "1.0"))


class HttpServicerContext:
    """The subset of ``grpc.aio.ServicerContext`` the A2A servicer uses, for one HTTP request."""

    def __init__(self, exchange: Exchange, time_remaining: float | None = None) -> None:
        self._exchange = exchange
        self._time_remaining = time_remaining
        self._code: grpc.StatusCode | None = None
        self._details = ""

    def auth_context(self) -> dict[str, Sequence[bytes]]:
        """As gRPC's: the verified client certificate under ``x509_pem_cert``."""
        pem = self._exchange.peer_cert_pem
        return {"x509_pem_cert": [pem]} if pem is not None else {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The request's headers (lowercased names), as gRPC metadata."""
        return self._exchange.metadata

    @property
    def presented_tokens(self) -> PresentedTokens | None:
        """The request's bearer tokens, as the edge read (and verified) them."""
        return self._exchange.tokens

    @property
    def edge_slot(self) -> EdgeSlot | None:
        """The limit slot the edge took for this request (``received.edge_slot`` reads it)."""
        return self._exchange.slot

    def time_remaining(self) -> float | None:
        """The HTTP bindings carry no deadline: None (the servicer's default applies)."""
        return self._time_remaining

    def peer(self) -> str:
        """Not an address: the servicer never identifies callers by it."""
        return "https"

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        """Raise :class:`Aborted` (as gRPC's, it never returns)."""
        raise Aborted(status)

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        """Plain abort (no rich status): an INTERNAL-like refusal carrying ``details``."""
        del trailing_metadata  # only the rich status carries a reason code
        raise Aborted(rpc_status.to_status(status_pb2.Status(code=code.value[0], message=details)))

    def set_code(self, code: grpc.StatusCode) -> None:
        """Kept for a servicer that sets a code without aborting."""
        self._code = code

    def set_details(self, details: str) -> None:
        """Kept for a servicer that sets details without aborting."""
        self._details = details

    def cancelled(self) -> bool:
        """False: a request the client dropped ends its handler task instead."""
        return False

    def done(self) -> bool:
        """False while the handler runs."""
        return False

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """Run ``callback(self)`` when the request ends (the edge calls them)."""
        self._exchange._done.append(lambda: callback(self))


def run_done_callbacks(exchange: Exchange) -> None:
    """Run what the servicer registered with ``add_done_callback`` (request over)."""
    callbacks, exchange._done[:] = list(exchange._done), []
    for callback in callbacks:
        callback()
