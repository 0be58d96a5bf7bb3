"""The gRPC side of an agent: servicer, health service, server lifecycle."""

from __future__ import annotations

import json
import logging
import time
from typing import NoReturn, Protocol

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gateway.errors import AddressUnavailable, GatewayError
from gateway.inbound.call import InvokeCall, deadline_from
from gateway.inbound.in_flight import serving_binding
from gateway.inbound.invoke_handler import InvokeHandler
from gateway.server.a2a import SERVICE_NAME as A2A_SERVICE_NAME
from gateway.server.a2a import A2AServicer, add_a2a_servicer
from gateway.server.received import (
    GenericOnly,
    MalformedRequest,
    peer_cert,
    request_tokens,
    tolerant,
)
from gateway.server.unknown_methods import UnknownMethods
from gateway.telemetry import Telemetry
from gateway.telemetry.tracing import mark_refused
from gateway.transport.status import to_grpc_status
from gateway.transport.tls import server_options
from gateway.wire.v1 import gateway_pb2

PROTOCOL_VERSION = "a2agw.v1"
SERVICE_NAME = "a2agw.v1.PeerGateway"

_log = logging.getLogger(__name__)


async def _refuse(context: aio.ServicerContext[object, object], err: GatewayError) -> NoReturn:
    """End the RPC with ``err``'s status (``abort_with_status`` raises, always)."""
    await context.abort_with_status(to_grpc_status(err))
    raise AssertionError("abort_with_status returned")  # unreachable: it raises


def add_gateway_servicer(servicer: GatewayServicer, server: aio.Server) -> None:
    """Register every RPC of ``PeerGateway`` with deserializers that never raise.

    The generated registration lets a corrupt message escape as an UNKNOWN
    status that no audit record sees; here it reaches the servicer instead.

    Its RPCs are the server's only *registered* methods (see
    :class:`GenericOnly` for why every other service is not).
    """
    service = gateway_pb2.DESCRIPTOR.services_by_name["PeerGateway"]
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=tolerant(getattr(gateway_pb2, method.input_type.name)),
            response_serializer=getattr(gateway_pb2, method.output_type.name).SerializeToString,
        )
        for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class GatewayServicer:
    """Adapts ``PeerGateway`` RPCs to the InvokeHandler; errors become rich statuses.

    Every RPC of the service is defined here (``add_gateway_servicer``
    registers them by name), so it needs no generated base class.
    """

    def __init__(
        self, agent_id: str, handler: InvokeHandler, telemetry: Telemetry | None = None
    ) -> None:
        self._agent_id = agent_id
        self._handler = handler
        self._telemetry = telemetry if telemetry is not None else Telemetry.off(agent_id)

    async def Describe(
        self, request: gateway_pb2.DescribeRequest, context: aio.ServicerContext[object, object]
    ) -> gateway_pb2.DescribeResponse:
        """What the calling peer may call here."""
        with self._telemetry.inbound(
            "Describe", context.invocation_metadata(), {"rpc.method": "Describe"}
        ) as span:
            try:
                grant, admissions = await self._handler.describe(
                    peer_cert(context), tokens=request_tokens(context)
                )
            except GatewayError as err:
                mark_refused(span, err)
                await _refuse(context, err)
        response = gateway_pb2.DescribeResponse(
            agent_id=self._agent_id,
            protocol_version=PROTOCOL_VERSION,
            max_payload_bytes=grant.max_payload_bytes,
            grant_expires_at=grant.expires_at.isoformat(),
        )
        for admission in admissions:
            contract = admission.capability.contract
            response.capabilities.add(
                name=contract.name,
                version=str(contract.version),
                risk=contract.risk.value,
                timeout_seconds=contract.timeout_seconds,
                idempotent=contract.idempotent,
                description=contract.description,
                input_schema_json=json.dumps(contract.input_schema(), sort_keys=True),
                output_schema_json=json.dumps(contract.output_schema(), sort_keys=True),
                preconditions=list(contract.preconditions),
                examples_json=[example.to_json() for example in contract.examples],
            )
        return response

    async def Invoke(
        self, request: gateway_pb2.InvokeRequest, context: aio.ServicerContext[object, object]
    ) -> gateway_pb2.InvokeResponse:
        """Run one capability for the calling peer."""
        serving_binding("a2agw.v1 gRPC")
        if isinstance(request, MalformedRequest):
            request = gateway_pb2.InvokeRequest()
            malformed = True
        else:
            malformed = False
        call = InvokeCall(
            peer_cert_pem=peer_cert(context),
            request_id=request.request_id,
            capability=request.capability,
            version_constraint=request.version_constraint,
            payload=request.payload,
            deadline=deadline_from(context.time_remaining(), request.deadline_unix_ms),
            task_id=request.task_id,
            step_id=request.step_id,
            idempotency_key=request.idempotency_key,
            malformed=malformed,
            deadline_unix_ms=request.deadline_unix_ms,
            tokens=request_tokens(context),
        )
        # Few attributes, set once: each costs the hot path. The request id,
        # versions and decision are in the audit record, which holds the trace id.
        attributes: dict[str, str | int] = {
            "a2agw.capability": request.capability[:128],
            "a2agw.payload_size": len(request.payload),
        }
        with self._telemetry.inbound("Invoke", context.invocation_metadata(), attributes) as span:
            try:
                outcome = await self._handler.invoke(call)
            except GatewayError as err:
                mark_refused(span, err)
                await _refuse(context, err)
        return gateway_pb2.InvokeResponse(
            request_id=request.request_id,
            capability=request.capability,
            served_version=outcome.served_version,
            payload=outcome.payload,
            evidence_sha256=outcome.evidence_sha256,
            replayed=outcome.remembered,
        )


class ServerCredentialSource(Protocol):
    """Anything that makes the server's credentials: ``TlsMaterial`` (fixed) or ``LiveTls``."""

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials that require and verify a client certificate."""
        ...


class GatewayServer:
    """A running ``grpc.aio`` server with mTLS, health and graceful shutdown."""

    def __init__(
        self,
        agent_id: str,
        handler: InvokeHandler,
        tls: ServerCredentialSource,
        a2a: A2AServicer | None = None,
        telemetry: Telemetry | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        # Sibling worker processes share the port (see gateway.runtime.supervisor).
        # gRPC sets SO_REUSEPORT unless told not to: a second instance would
        # then bind the same port silently and take half the connections.
        options = [*server_options(), ("grpc.so_reuseport", 1 if reuse_port else 0)]
        self._server = aio.server(options=options)
        add_gateway_servicer(GatewayServicer(agent_id, handler, telemetry), self._server)
        self._services = [SERVICE_NAME]
        if a2a is not None:  # same port, same mTLS, same handler
            add_a2a_servicer(a2a, GenericOnly(self._server))
            self._services.append(A2A_SERVICE_NAME)
        self._health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, GenericOnly(self._server))
        # Last: every method no handler above serves is refused and audited here.
        self._server.add_generic_rpc_handlers((UnknownMethods(handler),))
        self._tls = tls
        self.port = 0

    async def start(self, address: str) -> int:
        """Bind ``address`` (port 0 picks one) and start serving; returns the port.

        Raises:
            AddressUnavailable: the address cannot be bound (in use, or not on this host).
        """
        try:
            port: int = self._server.add_secure_port(address, self._tls.server_credentials())
            if port == 0:
                raise RuntimeError("no port bound")
        except RuntimeError as err:  # grpc's whole report of a failed bind
            raise AddressUnavailable(
                f"listen {address}: cannot bind (another process listens there, "
                "or the address is not on this host)"
            ) from err
        await self._server.start()
        for service in ("", *self._services):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self.port = port
        _log.info("serving %s on port %d", ", ".join(self._services), port)
        return port

    async def set_serving(self, serving: bool) -> None:
        """Publish SERVING or NOT_SERVING for every service (ignored once shutting down)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", *self._services):
            await self._health.set(service, status)

    async def enter_shutdown(self) -> None:
        """NOT_SERVING from now on, for good (calls in flight still finish)."""
        await self._health.enter_graceful_shutdown()

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting calls; let in-flight calls finish for up to ``grace`` seconds."""
        started = time.monotonic()
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        _log.info("server stopped in %.3fs", time.monotonic() - started)

    async def wait_for_termination(self) -> None:
        """Block until the server stops."""
        await self._server.wait_for_termination()
