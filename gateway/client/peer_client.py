"""Calling a peer: mTLS channel bound to the peer's SPIFFE ID, typed errors.

A call is sent only once the channel's TLS handshake, which checks the peer's
identity, has succeeded; a channel that cannot connect sent nothing, and only
then does ``PEER_IDENTITY_MISMATCH`` come up, decided by a handshake of our own
(``gateway.client.handshake``). The channel first pins the peer by the DNS
name derived from its SPIFFE ID; when that handshake of our own finds the
peer's certificate holds the SPIFFE ID but not that name (an SVID with only
its URI SAN), the client goes on through ``gateway.client.spiffe_relay``,
which pins the URI SAN itself. What a peer answers after a call was sent
never claims that nothing ran unless it is a refusal a peer may give
(``gateway.transport.status.from_rpc_error``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import ssl
import time
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio
from opentelemetry.trace import SpanKind

from capabilities.canonical import ascii_json
from gateway.client.handshake import (
    ServerIdentity,
    channel_connected,
    probe_server_identity,
)
from gateway.client.pinned_tls import pinned_context
from gateway.client.spiffe_relay import SpiffeRelay
from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    InvalidInput,
    PeerIdentityMismatch,
    PeerUnavailable,
)
from gateway.identity.presented import USER_TOKEN
from gateway.telemetry.tracing import AgentTracing, mark_refused, outgoing_metadata
from gateway.transport.status import from_rpc_error
from gateway.transport.tls import TlsMaterial, channel_options, relay_channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc


@dataclass(frozen=True, slots=True)
class RemoteCapability:
    """A capability as a peer describes it to us."""

    name: str
    version: str
    risk: str
    timeout_seconds: float
    idempotent: bool
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    preconditions: tuple[str, ...]
    examples: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class PeerDescription:
    """A peer's answer to Describe: who it is and what we may call."""

    agent_id: str
    protocol_version: str
    capabilities: tuple[RemoteCapability, ...]
    max_payload_bytes: int
    grant_expires_at: str


@dataclass(frozen=True, slots=True)
class InvokeResult:
    """A peer's successful answer."""

    request_id: str
    capability: str
    served_version: str
    payload: bytes
    evidence_sha256: str
    remembered: bool
    """The peer served its idempotency store's answer again (the wire's ``replayed``)."""

    def output(self) -> Any:
        """The output parsed from JSON."""
        return json.loads(self.payload)


class RequestIds:
    """Request ids for one client: a random prefix drawn once, then a counter.

    A request id is the peer's replay-protection key for this caller, so what
    matters is that it never repeats: the counter makes ids of one client
    distinct, the 64-bit random prefix makes clients (and restarts) distinct.
    Ids of one client are predictable from each other, which is fine: only
    this caller's certificate can use them. Cheaper than ``uuid4()`` per call
    (a ``getrandom`` system call each).
    """

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex() + "-"
        self._counter = itertools.count(1)

    def next(self) -> str:
        """A new id: 16 hex digits, ``-``, the counter in hex (matches ``REQUEST_ID``)."""
        return f"{self._prefix}{next(self._counter):x}"


class PeerClient:
    """One reusable mTLS channel to one peer.

    The TLS handshake only succeeds if the server's certificate holds the
    ``peer_id`` it is expected to be, and no call is sent before it has: by the
    DNS name derived from it (``policies.identity.svid_dns_name``), or, for a
    certificate without that name, by its URI SAN through a relay.

    Args:
        peer_id: The SPIFFE ID the peer must hold.
        address: Its ``host:port``.
        tls: This agent's certificate, key and bundles.
        tracing: Spans of the calls.
        through_relay: Start with the relay (the peer's certificate is known
            to carry only its URI SAN, e.g. from a client this one replaces).
    """

    def __init__(
        self,
        peer_id: str,
        address: str,
        tls: TlsMaterial,
        tracing: AgentTracing | None = None,
        *,
        through_relay: bool = False,
    ) -> None:
        self.peer_id = peer_id
        self.address = address
        self._tracing = tracing if tracing is not None else AgentTracing(peer_id, None)
        self._tls = tls
        self._relay: SpiffeRelay | None = None
        self._relay_wanted = through_relay
        self._switching = asyncio.Lock()
        self._channel = aio.secure_channel(
            address, tls.channel_credentials(peer_id), options=channel_options(peer_id)
        )
        self._stub = gateway_pb2_grpc.PeerGatewayStub(self._channel)  # type: ignore[no-untyped-call]
        self._ids = RequestIds()
        self._context: ssl.SSLContext | None = None

    @property
    def through_relay(self) -> bool:
        """True once calls go through the relay (the peer's SVID has only its URI SAN)."""
        return self._relay is not None

    async def describe(self, *, timeout: float = 5.0) -> PeerDescription:
        """Ask the peer what we may call there."""
        timeout = await self._connected(timeout)
        try:
            reply = await self._stub.Describe(
                gateway_pb2.DescribeRequest(), timeout=timeout, metadata=outgoing_metadata()
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err) from err
        return PeerDescription(
            agent_id=reply.agent_id,
            protocol_version=reply.protocol_version,
            capabilities=tuple(_remote_capability(c) for c in reply.capabilities),
            max_payload_bytes=reply.max_payload_bytes,
            grant_expires_at=reply.grant_expires_at,
        )

    async def invoke(
        self,
        capability: str,
        payload: bytes | dict[str, Any],
        *,
        constraint: str = "",
        timeout: float = 10.0,
        request_id: str | None = None,
        task_id: str = "",
        step_id: str = "",
        idempotency_key: str = "",
        user_token: str = "",
    ) -> InvokeResult:
        """Call ``capability`` on the peer; raises the GatewayError it answered with.

        ``user_token``: a token for the user the call acts for, made for this
        peer (``gateway.identity.exchange``), sent as ``a2agw-user-token``.
        """
        if isinstance(payload, dict):
            try:
                payload = ascii_json(payload, sort_keys=False)
            except (TypeError, ValueError) as err:
                raise InvalidInput(f"payload is not JSON-serialisable: {err}") from err
        request = gateway_pb2.InvokeRequest(
            request_id=request_id or self._ids.next(),
            capability=capability,
            version_constraint=constraint,
            payload=payload,
            deadline_unix_ms=int((time.time() + timeout) * 1000),
            task_id=task_id,
            step_id=step_id,
            idempotency_key=idempotency_key,
        )
        attributes: dict[str, str | int] = {
            "rpc.method": "Invoke",
            "peer.id": self.peer_id,
            "a2agw.capability": capability,
            "a2agw.request_id": request.request_id,
            "a2agw.payload_size": len(payload),
        }
        with self._tracing.span("peer call", attributes, SpanKind.CLIENT) as span:
            try:
                left = await self._connected(timeout)
            except GatewayError as err:
                mark_refused(span, err)
                raise
            metadata = outgoing_metadata()
            if user_token:
                metadata = (*metadata, (USER_TOKEN, user_token))
            try:
                reply = await self._stub.Invoke(request, timeout=left, metadata=metadata)
            except grpc.RpcError as err:
                error = from_rpc_error(err)
                mark_refused(span, error)
                raise error from err
        return InvokeResult(
            request_id=reply.request_id,
            capability=reply.capability,
            served_version=reply.served_version,
            payload=reply.payload,
            evidence_sha256=reply.evidence_sha256,
            remembered=reply.replayed,
        )

    async def _connected(self, timeout: float) -> float:
        """Wait until the channel's handshake has succeeded; the time left for the call.

        Raises:
            PeerIdentityMismatch: our own handshake found the server's certificate
                not valid for ``peer_id`` (nothing was sent).
            PeerUnavailable: the channel could not connect (nothing was sent).
            DeadlineExceeded: it did not connect within ``timeout``.
        """
        if self._channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return timeout
        started = time.monotonic()
        if self._relay_wanted and self._relay is None:
            await self._use_relay()
        relayed = self._relay is not None
        try:
            async with asyncio.timeout(timeout):
                connected = await channel_connected(self._channel)
        except TimeoutError as err:
            raise DeadlineExceeded(f"DEADLINE_EXCEEDED: no connection to {self.address}") from err
        left = timeout - (time.monotonic() - started)
        if connected:
            return left
        identity = await self._identity(left) if left > 0 else ServerIdentity.UNKNOWN
        if identity is ServerIdentity.EXPECTED_URI_ONLY and not relayed:
            self._relay_wanted = True  # the peer's certificate has no derived DNS name
            return await self._connected(timeout - (time.monotonic() - started))
        if identity is ServerIdentity.ANOTHER:
            raise PeerIdentityMismatch(
                f"the server's certificate is not valid for {self.peer_id}: "
                "it must carry that SPIFFE ID as its one URI SAN"
            )
        raise PeerUnavailable(f"UNAVAILABLE: could not connect to {self.address}")

    async def _identity(self, timeout: float) -> ServerIdentity:
        try:
            if self._context is None:
                self._context = pinned_context(self._tls, self.peer_id, alpn=["h2"])
        except (ssl.SSLError, ValueError, GatewayError):  # a bundle Python's ssl cannot read
            return ServerIdentity.UNKNOWN
        return await probe_server_identity(self.address, self._context, self.peer_id, timeout)

    async def _use_relay(self) -> None:
        """From now on, reach the peer through a relay that pins its URI SAN.

        Raises:
            PeerUnavailable: no bundle for the peer's trust domain, or the relay
                could not listen (nothing was sent).
        """
        async with self._switching:
            if self._relay is not None:
                return
            try:
                if self._context is None:
                    self._context = pinned_context(self._tls, self.peer_id, alpn=["h2"])
                relay = SpiffeRelay(self.address, self._context)
                target = await relay.start()
            except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
                raise PeerUnavailable(f"UNAVAILABLE: no relay to {self.address}: {err}") from err
            native, self._relay = self._channel, relay
            options = relay_channel_options(self.peer_id)
            self._channel = aio.insecure_channel(target, options=options)
            self._stub = gateway_pb2_grpc.PeerGatewayStub(self._channel)  # type: ignore[no-untyped-call]
            await native.close()

    async def close(self, grace: float | None = None) -> None:
        """Close the channel; with ``grace``, calls in flight get that long to finish."""
        await self._channel.close(grace)
        if self._relay is not None:
            await self._relay.close()

    async def __aenter__(self) -> PeerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _remote_capability(desc: gateway_pb2.CapabilityDescriptor) -> RemoteCapability:
    try:
        return RemoteCapability(
            name=desc.name,
            version=desc.version,
            risk=desc.risk,
            timeout_seconds=desc.timeout_seconds,
            idempotent=desc.idempotent,
            description=desc.description,
            input_schema=json.loads(desc.input_schema_json or "{}"),
            output_schema=json.loads(desc.output_schema_json or "{}"),
            preconditions=tuple(desc.preconditions),
            examples=tuple(json.loads(example) for example in desc.examples_json),
        )
    except (json.JSONDecodeError, RecursionError) as err:  # not JSON, or nested past parsing
        raise GatewayError(f"peer described {desc.name} with malformed JSON schema") from err
