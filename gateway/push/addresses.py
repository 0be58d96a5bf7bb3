"""Which IP addresses a webhook delivery may connect to.

A public unicast address is fine. Any other (loopback, private, link-local,
shared/CGNAT, unique-local, cloud metadata, reserved, documentation, ...) is
refused unless the caller's grant names that very address in ``push_hosts``:
an operator who writes ``"10.0.0.7"`` there means it. Some are refused even
then, since no webhook can live there: the unspecified address (``0.0.0.0``
reaches the local host on Linux), multicast and broadcast.

An IPv6 address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``,
NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged as that IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from enum import StrEnum

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text)
    for text in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
"""Cloud instance metadata services (AWS, ECS, Alibaba, AWS over IPv6)."""


class AddressClass(StrEnum):
    """What kind of address a webhook resolved to (named in audit details)."""

    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link-local"
    METADATA = "metadata"
    SHARED = "shared"
    UNIQUE_LOCAL = "unique-local"
    NON_GLOBAL = "non-global"
    UNSPECIFIED = "unspecified"
    MULTICAST = "multicast"
    BROADCAST = "broadcast"


NEVER = frozenset({AddressClass.UNSPECIFIED, AddressClass.MULTICAST, AddressClass.BROADCAST})
"""Refused even when the grant names the address."""


def judged(address: IPAddress) -> IPAddress:
    """The address a check looks at: the IPv4 address an IPv6 one carries, else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def address_class(address: IPAddress) -> AddressClass:
    """The class of ``address`` (after :func:`judged`)."""
    address = judged(address)
    if address in METADATA_ADDRESSES:
        return AddressClass.METADATA
    if address.is_unspecified or (
        isinstance(address, ipaddress.IPv4Address) and address in _THIS_NETWORK
    ):
        return AddressClass.UNSPECIFIED
    if address.is_multicast:
        return AddressClass.MULTICAST
    if address == _BROADCAST:
        return AddressClass.BROADCAST
    if address.is_loopback:
        return AddressClass.LOOPBACK
    if address.is_link_local:
        return AddressClass.LINK_LOCAL
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return AddressClass.SHARED
    if isinstance(address, ipaddress.IPv6Address) and address in ipaddress.IPv6Network("fc00::/7"):
        return AddressClass.UNIQUE_LOCAL
    if address.is_private:
        return AddressClass.PRIVATE
    if not address.is_global:
        return AddressClass.NON_GLOBAL
    return AddressClass.PUBLIC


def address_refusal(address: IPAddress, named: frozenset[IPAddress]) -> AddressClass | None:
    """Why ``address`` may not be connected to (None: it may).

    ``named``: the addresses the caller's grant lists in ``push_hosts``.
    """
    kind = address_class(address)
    if kind is AddressClass.PUBLIC:
        return None
    if kind not in NEVER and (address in named or judged(address) in named):
        return None
    return kind


def named_addresses(push_hosts: Iterable[str]) -> frozenset[IPAddress]:
    """The IP addresses among ``push_hosts`` entries (names are left out)."""
    found: set[IPAddress] = set()
    for entry in push_hosts:
        try:
            found.add(ipaddress.ip_address(entry))
        except ValueError:
            continue
    return frozenset(found)
