"""What a webhook URL may be, and whether a caller's grant lets it name that host.

A webhook URL is ``https://HOST[:PORT][/PATH][?QUERY]`` and nothing looser:

- the scheme is ``https`` (the body and the credentials travel in it);
- no user info (``user:pass@``), no fragment, no percent-encoding or
  backslash in the authority, only printable ASCII, at most 2048 characters;
- HOST is a lowercase-able DNS name of LDH labels whose last label is not all
  digits, a dotted-quad IPv4 address, or a bracketed IPv6 address without a
  zone. So none of the spellings that parse differently in different
  libraries (``127.1``, ``2130706433``, ``0177.0.0.1``, ``a\\@b``) gets in;
- PORT is 1-65535 (default 443).

The host must then match the caller's grant's ``push_hosts``: a name exactly,
or ``*.NAME`` for any name below NAME; an IP address exactly. An IP address
host is checked against :mod:`gateway.push.addresses` here already; a name is
resolved, and its addresses checked, at each delivery attempt.
"""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.errors import PushUrlRefused
from gateway.push.addresses import IPAddress, address_refusal, named_addresses
from policies.grants import is_dns_name

MAX_URL_CHARS = 2048
_PRINTABLE = frozenset(string.printable) - frozenset(string.whitespace)
_DEFAULT_PORT = 443


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    """A webhook URL that passed :func:`parse_webhook_url`.

    Attributes:
        url: The URL as the caller gave it.
        host: Its host, lowercase (an IP address as :mod:`ipaddress` writes it,
            without brackets).
        port: Its port (443 when absent).
        target: Path and query, as sent in the request line (``/`` at least).
        literal: The host's IP address when the host is one (None for a name).
    """

    url: str
    host: str
    port: int
    target: str
    literal: IPAddress | None

    @property
    def authority(self) -> str:
        """The ``Host`` header: the host (IPv6 in brackets) and any port but 443."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORT else f"{host}:{self.port}"

    @property
    def shown(self) -> str:
        """``HOST:PORT`` for audit details and logs (never the path or query)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_webhook_url(url: str) -> WebhookUrl:
    """``url`` as a :class:`WebhookUrl`.

    Raises:
        PushUrlRefused: it is not an https URL of the form the module doc gives.
    """
    if not url:
        raise PushUrlRefused("the webhook url is empty")
    if len(url) > MAX_URL_CHARS or not set(url) <= _PRINTABLE:
        raise PushUrlRefused(
            f"the webhook url must be at most {MAX_URL_CHARS} printable ASCII characters"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise PushUrlRefused("the webhook url cannot be parsed") from err
    if parts.scheme.lower() != "https":
        raise PushUrlRefused("the webhook url must be https")
    if "@" in parts.netloc or "%" in parts.netloc or "\\" in url:
        raise PushUrlRefused("the webhook url may hold no user info, escapes or backslashes")
    if parts.fragment or url.endswith("#"):
        raise PushUrlRefused("the webhook url may hold no fragment")
    host, literal = _host(parts.netloc, parts.hostname or "")
    if port == 0:
        raise PushUrlRefused("the webhook url's port must be 1-65535")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookUrl(url, host, port or _DEFAULT_PORT, target, literal)


def _host(netloc: str, hostname: str) -> tuple[str, IPAddress | None]:
    if netloc.startswith("["):
        try:
            address = ipaddress.IPv6Address(hostname)
        except ValueError as err:
            raise PushUrlRefused("the webhook url's IPv6 host is not an address") from err
        return str(address), address
    try:
        v4 = ipaddress.IPv4Address(hostname)
    except ValueError:
        if not is_dns_name(hostname):
            raise PushUrlRefused(
                "the webhook url's host must be a DNS name or an IP address"
            ) from None
        return hostname, None
    return str(v4), v4


def host_allowed(host: str, push_hosts: Iterable[str]) -> bool:
    """True when an entry of ``push_hosts`` names ``host`` (see the module doc)."""
    for entry in push_hosts:
        if entry == host:
            return True
        if entry.startswith("*.") and host.endswith(entry[1:]) and len(host) > len(entry) - 1:
            return True
    return False


def check_granted(url: WebhookUrl, push_hosts: tuple[str, ...]) -> None:
    """Refuse ``url`` unless ``push_hosts`` names its host (and, for an address, allows it).

    Raises:
        PushUrlRefused: the host is not named, or is an address never reached.
    """
    if not host_allowed(url.host, push_hosts):
        raise PushUrlRefused(
            f"the webhook host {url.host[:80]} is not in this caller's push_hosts",
            detail=f"host={url.shown}",
        )
    if url.literal is not None:
        refusal = address_refusal(url.literal, named_addresses(push_hosts))
        if refusal is not None:
            raise PushUrlRefused(
                f"the webhook address is {refusal.value}: never a webhook",
                detail=f"host={url.shown} class={refusal.value}",
            )
