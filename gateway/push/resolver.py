"""The one name lookup of a delivery attempt: its answer is what the attempt connects to.

A delivery resolves the webhook's name once, checks every address of the
answer (:mod:`gateway.push.addresses`) and connects to the first, by address:
nothing looks the name up again between the check and the connection, so a
name that answers differently on each lookup (DNS rebinding) cannot swap a
checked address for another. :data:`Resolver` is the seam tests replace.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence

from gateway.push.addresses import IPAddress

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""``(name, port) -> addresses`` (text); raises OSError when the name does not resolve."""


async def system_resolver(name: str, port: int) -> Sequence[str]:
    """The addresses the system resolver gives ``name`` for TCP, in its order, each once."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def parsed_addresses(answer: Sequence[str]) -> list[IPAddress]:
    """``answer`` as addresses (a zone suffix dropped).

    Raises:
        OSError: the answer is empty or holds something that is not an address.
    """
    addresses: list[IPAddress] = []
    for text in answer:
        try:
            addresses.append(ipaddress.ip_address(str(text).split("%", 1)[0]))
        except ValueError as err:
            raise OSError(f"the resolver answered a non-address {str(text)[:64]!r}") from err
    if not addresses:
        raise OSError("the name resolved to no address")
    return addresses
