"""A2A Peer Gateway: mTLS gRPC serving and calling of agent capabilities."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.errors import ERROR_DOMAIN, GatewayError

__all__ = ["ERROR_DOMAIN", "GatewayError"]


def __getattr__(name: str) -> object:
    """``gateway.GatewayError`` and ``gateway.ERROR_DOMAIN``, loaded on first use.

    Importing the package loads nothing else: ``policies`` and ``capabilities``
    import the error tree (a leaf) without anything else of ours.
    """
    if name in __all__:
        from gateway import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'gateway' has no attribute {name!r}")
