"""GenericOnly: a service registered through it is served by its generic handler alone."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gateway.server.received import GenericOnly


class RecordingServer:
    """Stands in for aio.Server to see what GenericOnly passes on (we own neither side)."""

    def __init__(self) -> None:
        self.generic: list[object] = []
        self.registered: list[str] = []

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        self.generic.append(handlers)

    def add_registered_method_handlers(self, service: str, handlers: object) -> None:
        self.registered.append(service)


def test_generic_handlers_pass_and_registered_methods_do_not() -> None:
    recording = RecordingServer()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), GenericOnly(recording))  # type: ignore[arg-type]
    assert len(recording.generic) == 1 and recording.registered == []


async def test_a_service_registered_generic_only_is_served() -> None:
    server = aio.server()
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, GenericOnly(server))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await health.set("svc", health_pb2.HealthCheckResponse.SERVING)
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service="svc"), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(aio.AioRpcError) as unknown:
                await channel.unary_unary("/grpc.health.v1.Health/Nope")(b"", timeout=10)
            assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)
