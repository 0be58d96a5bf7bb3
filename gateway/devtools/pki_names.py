"""What a dev CA permits besides SPIFFE IDs, and the check of an SVID's extra names.

A dev CA's certificate carries critical name constraints with DNS subtrees
only: ``svid.a2agw.invalid`` (the derived names), ``localhost`` and whatever
``pki init --permit-dns`` added. Verifiers then refuse any certificate of the
CA with another DNS name.

No IP-address subtrees: BoringSSL (gRPC's TLS, in every gRPC client and server
here) cannot evaluate them and fails *every* handshake with a certificate
that has an IP SAN under such a CA ("unsupported name constraint type"),
though OpenSSL accepts it. CAs made before this change carry loopback IP
subtrees; they still work for certificates without IP SANs, and ``pki issue``
refuses IP names from them instead of writing a certificate no gRPC peer
accepts. IP SANs are therefore limited by the issuing tool, not by the CA:
``pki issue`` adds them only when asked (``--loopback-sans``, ``--ip``).

Extra DNS names must fall inside the CA's DNS subtrees (else every verifier
refuses the certificate) and never under ``svid.a2agw.invalid``, where a name
stands for a SPIFFE ID: another agent's derived name would let this
certificate answer for that agent.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from cryptography import x509

from gateway.errors import ConfigError
from policies.identity import SVID_DNS_SUFFIX

LOOPBACK_DNS = "localhost"
DEFAULT_PERMITTED_DNS = (SVID_DNS_SUFFIX, LOOPBACK_DNS)
"""The DNS subtrees of every dev CA."""

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")


def dns_name(text: str) -> str:
    """``text`` as a lowercase DNS name (no wildcard, no trailing dot).

    Raises:
        ConfigError: it is not a DNS name (a wildcard is refused here too).
    """
    name = text.strip().lower()
    if "*" in name:
        raise ConfigError(f"wildcard DNS names are never issued: {text!r}")
    if not _DNS_NAME.fullmatch(name):
        raise ConfigError(f"not a DNS name: {text!r} (letters, digits, '-' and '.')")
    return name


def name_constraints(permit_dns: Sequence[str] = ()) -> x509.NameConstraints:
    """The constraints of a new dev CA: the default DNS subtrees plus ``permit_dns``.

    Raises:
        ConfigError: an entry of ``permit_dns`` is not a DNS name.
    """
    subtrees = list(DEFAULT_PERMITTED_DNS)
    for text in permit_dns:
        name = dns_name(text)
        if name not in subtrees:
            subtrees.append(name)
    return x509.NameConstraints(
        permitted_subtrees=[x509.DNSName(name) for name in subtrees], excluded_subtrees=None
    )


def check_extra_names(
    ca: x509.Certificate, dns_names: Sequence[str], ip_addresses: Sequence[str]
) -> None:
    """Refuse extra SVID names that this CA's certificate would make verifiers reject.

    Raises:
        ConfigError: a DNS name is malformed, under ``svid.a2agw.invalid`` or
            outside the CA's permitted DNS subtrees; an IP address is
            malformed, or the CA constrains IP addresses (an older dev CA).
    """
    permitted, constrains_ips = _permitted(ca)
    for text in dns_names:
        name = dns_name(text)
        if _within(name, SVID_DNS_SUFFIX):
            raise ConfigError(
                f"DNS name {name!r}: names under {SVID_DNS_SUFFIX} stand for SPIFFE IDs "
                "(one could answer for another agent); they are never extra names"
            )
        if permitted is not None and not any(_within(name, tree) for tree in permitted):
            raise ConfigError(
                f"DNS name {name!r} is outside the CA's name constraints (permitted: "
                f"{', '.join(permitted)}); make the CA with pki init --permit-dns {name}"
            )
    for text in ip_addresses:
        try:
            ipaddress.ip_address(text)
        except ValueError as err:
            raise ConfigError(f"not an IP address: {text!r}") from err
    if ip_addresses and constrains_ips:
        raise ConfigError(
            "this CA's name constraints include IP addresses (made by an older pki init): "
            "gRPC's TLS (BoringSSL) refuses every certificate with an IP SAN under it; "
            "make a new CA (pki init --force, then re-issue every agent) or leave out "
            "--loopback-sans/--ip"
        )


def _permitted(ca: x509.Certificate) -> tuple[list[str] | None, bool]:
    """The CA's permitted DNS subtrees (None: DNS unconstrained), and whether it constrains IPs."""
    try:
        constraints = ca.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None, False
    subtrees = list(constraints.permitted_subtrees or [])
    excluded = list(constraints.excluded_subtrees or [])
    dns = [str(tree.value).lower() for tree in subtrees if isinstance(tree, x509.DNSName)]
    ips = any(isinstance(tree, x509.IPAddress) for tree in subtrees + excluded)
    return (dns if dns else None), ips


def _within(name: str, subtree: str) -> bool:
    return name == subtree or name.endswith("." + subtree.lstrip("."))
