"""``[[peers]]``: the peers this agent knows and where they listen."""

from __future__ import annotations

from gateway.config.addresses import (
    DialAddress,
)
from gateway.config.fields import FrozenTable
from policies.identity import SpiffeId


class PeerEntry(FrozenTable):
    """A peer this agent may call.

    Attributes:
        id: The peer's SPIFFE ID; its server certificate must carry it.
        address: ``host:port`` of its gateway.
    """

    id: SpiffeId
    address: DialAddress
