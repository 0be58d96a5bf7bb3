"""A2A Peer Gateway: mTLS gRPC serving and calling of agent capabilities."""

from gateway import hotpath

hotpath.install()  # before any module it may load compiled is imported

from gateway.errors import ERROR_DOMAIN, GatewayError  # noqa: E402

__all__ = ["ERROR_DOMAIN", "GatewayError"]
