"""A2A 1.0 over HTTPS: the JSON-RPC and HTTP+JSON (REST) bindings, beside the gRPC one.

The a2a-sdk's own routes parse the wire (so it is the spec's); every method
then runs the gRPC binding's servicer method through an adapter context, so
there is one decision path and one audit record per request whatever the
binding. See ``edge`` for what is decided before the SDK parses anything.
"""

from gateway.server.a2a_http.edge import JSONRPC_PATH, REST_PATH, HttpEdge
from gateway.server.a2a_http.server import A2AHttpServer

__all__ = ["JSONRPC_PATH", "REST_PATH", "A2AHttpServer", "HttpEdge"]
