"""Registering ``lf.a2a.v1.A2AService`` on a grpc.aio server, with tolerant deserializers."""

from __future__ import annotations

from typing import Any

import grpc
from a2a.types import a2a_pb2
from google.protobuf import message_factory
from grpc import aio

from gateway.server.a2a.request_checks import SERVICE_NAME
from gateway.server.a2a.servicer import A2AServicer
from gateway.server.received import GenericOnly, tolerant


def a2a_method_names() -> list[str]:
    """Every RPC of ``A2AService`` as the SDK's descriptor lists it."""
    return [method.name for method in a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].methods]


def add_a2a_servicer(servicer: A2AServicer, server: aio.Server | GenericOnly) -> None:
    """Register every RPC of ``A2AService`` with deserializers that never raise.

    Like ``add_gateway_servicer``: a corrupt request reaches the servicer as
    ``MalformedRequest`` and is refused (INVALID_REQUEST) and audited, instead of
    escaping as an unaudited UNKNOWN. Streaming RPCs are registered as
    server-streaming: their servicer methods are async generators.
    """
    service = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
    handlers: dict[str, Any] = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=tolerant(request_class),
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
