"""``a2a-gateway spiffe``: what an operator needs to register an agent with SPIRE."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.errors import ConfigError
from policies.identity import is_spiffe_id, svid_dns_name


def add_commands(commands: Any) -> None:
    """Register ``spiffe dns-name``."""
    spiffe = commands.add_parser("spiffe", help="SPIFFE identities (SPIRE registration)")
    sub = spiffe.add_subparsers(dest="spiffe_command", required=True, metavar="ACTION")
    dns_name = sub.add_parser(
        "dns-name",
        help="print the DNS name derived from SPIFFE_ID, optional on its SVID, for clients "
        "that verify only host names (spire-server entry create -dns NAME)",
    )
    dns_name.add_argument("spiffe_id", metavar="SPIFFE_ID", help="the agent's SPIFFE ID")
    dns_name.set_defaults(run=_dns_name)


def _dns_name(args: argparse.Namespace) -> int:
    if not is_spiffe_id(args.spiffe_id):
        raise ConfigError(f"{args.spiffe_id!r} is not a SPIFFE ID (spiffe://trust-domain/path)")
    print(svid_dns_name(args.spiffe_id))
    return 0
