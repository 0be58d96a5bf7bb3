"""A2A Peer Gateway: mTLS gRPC serving and calling of agent capabilities."""

from gateway.errors import ERROR_DOMAIN, GatewayError

__all__ = ["ERROR_DOMAIN", "GatewayError"]
