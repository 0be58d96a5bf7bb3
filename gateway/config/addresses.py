"""``host:port`` config values, checked when the config loads.

Without this, ``listen = "127.0.0.1:70001"`` reached gRPC, which takes the
port modulo 65536 and served on 4465; ``"127.0.0.1:abc"`` failed only when
the server bound. Every address-valued config field uses one of the two types
here, so the config error names the file, the key and the problem.

Rules: a host (a name, an IPv4 literal or a bracketed IPv6 literal such as
``[::1]``), one ``:``, and a decimal port. A listen address may use port 0
(the kernel picks one); an address to dial needs 1..65535.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

MAX_PORT = 65535


def split_host_port(value: str, *, lowest_port: int) -> tuple[str, int]:
    """``(host, port)`` of ``value``; the host keeps IPv6 brackets.

    Raises:
        ValueError: no host, no port, a port that is not decimal or outside
            ``lowest_port..65535``, or an IPv6 literal without brackets.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r}: expected host:port")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{value!r}: an IPv6 host goes in brackets, e.g. [::1]:7001")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"{value!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not lowest_port <= port <= MAX_PORT:
        raise ValueError(f"{value!r}: port {port} is outside {lowest_port}..{MAX_PORT}")
    return host, port


def _listen(value: str) -> str:
    split_host_port(value, lowest_port=0)
    return value


def _dial(value: str) -> str:
    split_host_port(value, lowest_port=1)
    return value


ListenAddress = Annotated[str, AfterValidator(_listen)]
"""``host:port`` to bind; port 0..65535 (0: the kernel picks one)."""

DialAddress = Annotated[str, AfterValidator(_dial)]
"""``host:port`` to connect to; port 1..65535."""


def names_this_machine(host: str) -> bool:
    """Whether a ``Host`` value is an IP literal or ``localhost`` (port or not).

    Any other name may be one an attacker's DNS points at 127.0.0.1 (DNS
    rebinding): a browser would then let that name's pages read the answers.
    """
    name = host
    if name.startswith("["):
        name, bracket, rest = name[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return False
    elif name.count(":") == 1:
        name, _, port = name.partition(":")
        if not port.isdigit():
            return False
    if name.lower().rstrip(".") == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


_HOST_NAME = re.compile(
    r"(?i)[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
)


def https_base_url_problem(text: str) -> str | None:
    """Why ``text`` is not ``https://HOST[:PORT]`` (None if it is).

    The base the cards' HTTP binding URLs (``/a2a/jsonrpc``, ``/a2a/rest``) are
    appended to: another scheme, a path, query or fragment, a user,
    whitespace or a bad port would be signed into a card as interfaces no
    client can use. HOST is a name, an IPv4 or a bracketed IPv6 literal.
    """
    if not text.startswith("https://"):
        return "the HTTP bindings are served over TLS"
    if any(c.isspace() or not c.isprintable() for c in text):
        return "no whitespace or control characters"
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed or invalid [IPv6] literal
        return "not an IPv6 address"
    try:
        port = parts.port
    except ValueError:
        return f"a port is 1..{MAX_PORT}"
    if parts.path or parts.query or parts.fragment or text.endswith(("?", "#")):
        return "no path, query or fragment"
    host = parts.hostname or ""
    if "@" in parts.netloc or parts.netloc.endswith(":") or not host:
        return "a host and an optional port, nothing else"
    if port == 0:
        return f"a port is 1..{MAX_PORT}"
    if parts.netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address"
    elif not _HOST_NAME.fullmatch(host):
        return "not a host name"
    return None


def is_loopback_literal(host: str) -> bool:
    """True if ``host`` is a loopback IP literal (a name is never one: the resolver decides)."""
    # IP literals only: a name such as "localhost" is whatever the resolver says.
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
