"""Offline commands: pki, policy check, audit."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit import (
    AuditRecord,
    format_json_lines,
    format_table,
    query_records,
    verify_chain,
)
from gateway.audit.checkpoint_verify import UNKNOWN_SIGNER, verify_checkpoints
from gateway.audit.signer_archive import read_signers, signers_file
from gateway.audit.store.postgres import query_agent_records, verify_agent_chains
from gateway.audit.summary import format_summary, format_summary_json, summarize
from gateway.audit.verify import ChainProblem
from gateway.cli import audit_follow, policy_commands
from gateway.config import WorkloadApiTls, load_agent_config
from gateway.devtools import pki
from gateway.display import json_for_terminals, printable
from gateway.errors import ConfigError
from gateway.storage import connection_source, open_audit_reader
from gateway.transport.tls import load_pem_file
from policies.grants import PeerGrant
from policies.policy_file import load_policy


def add_commands(commands: Any) -> None:
    """Register pki, policy and audit."""
    pki_parser = commands.add_parser("pki", help="development certificates")
    pki_sub = pki_parser.add_subparsers(dest="pki_command", required=True, metavar="ACTION")
    init = pki_sub.add_parser("init", help="make a CA for a trust domain")
    init.add_argument(
        "--dir", type=Path, required=True, help="folder for ca.pem and ca.key (made if missing)"
    )
    init.add_argument("--trust-domain", required=True, help="e.g. example.org")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.add_argument(
        "--permit-dns",
        action="append",
        default=[],
        metavar="SUFFIX",
        help="also let its SVIDs carry DNS names under SUFFIX (repeatable; fixed for the CA)",
    )
    init.set_defaults(run=_pki_init)
    issue = pki_sub.add_parser("issue", help="issue spiffe://DOMAIN/agent/NAME")
    issue.add_argument("name", help="the SVID is for spiffe://DOMAIN/agent/NAME")
    issue.add_argument(
        "--dir",
        type=Path,
        required=True,
        help="the CA's folder (pki init); NAME.pem and NAME.key are written there",
    )
    issue.add_argument(
        "--days", type=certificate_days, default=30, help=f"1..{MAX_DAYS} (default 30)"
    )
    issue.add_argument(
        "--loopback-sans",
        action="store_true",
        help="also DNS:localhost and IP:127.0.0.1/::1, for tools that dial loopback without "
        "the name override (such clients cannot tell this agent from another)",
    )
    issue.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name, e.g. for an https:// URL (repeatable; inside the CA's "
        "--permit-dns suffixes or localhost)",
    )
    issue.add_argument(
        "--ip", action="append", default=[], metavar="ADDR", help="extra IP address (repeatable)"
    )
    issue.add_argument(
        "--uri-san-only",
        action="store_true",
        help="leave out the DNS name derived from the SPIFFE ID, as SPIRE does without -dns "
        "(clients pin the URI SAN)",
    )
    issue.add_argument(
        "--force",
        action="store_true",
        help="re-issue over an existing certificate and key (atomic replace; a running agent "
        "picks the new pair up)",
    )
    issue.set_defaults(run=_pki_issue)

    policy = commands.add_parser("policy", help="policy files")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = policy_sub.add_parser("check", help="validate a policy file and explain problems")
    check.add_argument("file", type=Path, help="policy file (TOML)")
    check.set_defaults(run=_policy_check)
    policy_commands.add_actions(policy_sub)

    audit = commands.add_parser("audit", help="read or verify an audit log")
    audit.add_argument("action", nargs="?", choices=["verify"], help="verify the hash chain")
    audit.add_argument(
        "--db",
        type=policy_commands.store_location,
        required=True,
        help="SQLite file, or postgresql://... (the shared table of many agents)",
    )
    audit.add_argument("--agent", help="PostgreSQL: only this agent's chain (SPIFFE ID)")
    audit.add_argument("--refusals", action="store_true", help="only refused calls")
    audit.add_argument("--peer", help="only this peer's SPIFFE ID")
    audit.add_argument("--capability", help="only this capability")
    audit.add_argument("--since", help="e.g. 30s, 10m, 2h, 1d")
    audit.add_argument("--trace", metavar="TRACE_ID", help="only records of this trace id")
    audit.add_argument("--json", action="store_true", help="JSON lines")
    audit.add_argument(
        "--follow",
        action="store_true",
        help="print records as they commit until interrupted (with --since: that window first)",
    )
    audit.add_argument(
        "--summary",
        action="store_true",
        help="calls per peer, decision and reason (aggregated limit refusals summed by count)",
    )
    audit.add_argument(
        "--checkpoints",
        type=Path,
        help="verify: also check the log against this signed checkpoint file",
    )
    audit.add_argument(
        "--cert",
        type=Path,
        action="append",
        help="verify: certificate (PEM) of the agent that signed them; repeat it for the "
        "certificates used before a rotation",
    )
    audit.add_argument(
        "--ca",
        type=Path,
        help="verify: CA (PEM) the certificate each checkpoint line carries must chain to; "
        "then lines signed before rotations verify without their --cert",
    )
    audit.add_argument(
        "--config",
        type=Path,
        help="verify: take --cert, --ca (and --checkpoints) from this agent config",
    )
    audit.set_defaults(run=_audit)


MAX_DAYS = 36500
"""The longest ``pki issue --days`` (a hundred years; later dates overflow X.509 times)."""


def certificate_days(text: str) -> int:
    """An argparse type: a certificate lifetime in whole days, 1..``MAX_DAYS``."""
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {text!r}") from None
    if not 1 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_DAYS} days, not {days}")
    return days


def _pki_init(args: argparse.Namespace) -> int:
    path = pki.init_ca(
        args.dir, args.trust_domain, overwrite=args.force, permit_dns=args.permit_dns
    )
    print(f"CA for spiffe://{args.trust_domain} written to {printable(str(path))}")
    return 0


def _pki_issue(args: argparse.Namespace) -> int:
    from datetime import timedelta

    issued = pki.issue(
        args.dir,
        args.name,
        valid_for=timedelta(days=args.days),
        loopback_sans=args.loopback_sans,
        overwrite=args.force,
        dns_names=args.dns,
        ip_addresses=args.ip,
        uri_san_only=args.uri_san_only,
    )
    print(printable(f"{issued.spiffe_id}: {issued.cert_path} {issued.key_path}"))
    if issued.dropped_names:
        print(
            f"warning: the certificate replaced also named {', '.join(issued.dropped_names)};"
            " this one does not (pass the same --dns / --ip / --loopback-sans to keep them)",
            file=sys.stderr,
        )
    return 0


def _audit_verify_agents(args: argparse.Namespace) -> int:
    checkpoints, pems, ca_pem = _checkpoint_sources(args)
    reports = verify_agent_chains(connection_source(args.db), args.agent)
    broken = 0
    for agent, report in reports.items():
        shown = printable(agent)
        if report.ok:
            print(f"{shown}: chain intact ({report.records} records)")
            continue
        broken += 1
        for problem in report.problems:
            print(f"{shown}: seq {problem.seq}: {problem.kind}: {problem.message}")
        print(f"{shown}: chain BROKEN ({len(report.problems)} problem(s))", file=sys.stderr)
    print(f"{printable(str(args.db))}: {len(reports)} chain(s), {broken} broken")
    if checkpoints is None or not pems:
        return 1 if broken else 0
    # The certificates name the agent whose chain the checkpoints sign.
    checked = verify_checkpoints(open_audit_reader(args.db), checkpoints, pems, ca_pem=ca_pem)
    for problem in checked.problems:
        print(
            f"{printable(str(checkpoints))}: seq {problem.seq}: {problem.kind}: {problem.message}"
        )
    print(
        f"{printable(str(checkpoints))}: {checked.valid} of {checked.checkpoints} checkpoints valid"
    )
    _hint_signers(checked.problems)
    return 1 if broken or not checked.ok else 0


def _audit_agents(args: argparse.Namespace) -> int:
    entries = query_agent_records(connection_source(args.db), audit_follow.audit_filter(args))
    if not entries and not args.json:
        print(_no_records(args))
        return 0
    if args.summary:  # across agents: the per-peer counts an auditor asks for
        rows = summarize([entry.record for entry in entries])
        text = format_summary_json(rows) if args.json else format_summary(rows)
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        return 0
    if args.json:
        for entry in entries:
            line = {"agent_id": entry.agent_id, **entry.record.to_json_dict()}
            sys.stdout.write(json_for_terminals(json.dumps(line, sort_keys=True)) + "\n")
        return 0
    by_agent: dict[str, list[AuditRecord]] = {}
    for entry in entries:
        by_agent.setdefault(entry.agent_id, []).append(entry.record)
    for agent, records in sorted(by_agent.items()):
        sys.stdout.write(f"== {printable(agent)}\n{format_table(records)}")
    return 0


def _no_records(args: argparse.Namespace) -> str:
    """What an empty listing says instead of a bare header: no records, and under which filters."""
    filters = [
        f"--{name.replace('_', '-')} {printable(str(getattr(args, name)))}"
        for name in ("agent", "peer", "capability", "since", "trace")
        if getattr(args, name, None)
    ]
    if args.refusals:
        filters.insert(0, "--refusals")
    return f"no records match {' '.join(filters)}" if filters else "no records yet"


def _audit_verify(args: argparse.Namespace) -> int:
    if open_audit_reader(args.db).many_chains:
        return _audit_verify_agents(args)
    checkpoints, cert_pems, ca_pem = _checkpoint_sources(args)
    log = open_audit_reader(args.db)
    report = verify_chain(log)
    problems = list(report.problems)
    summary = f"{report.records} records"
    if checkpoints is not None and cert_pems:
        checked = verify_checkpoints(log, checkpoints, cert_pems, ca_pem=ca_pem)
        problems.extend(checked.problems)
        summary += f"; {checked.valid} of {checked.checkpoints} checkpoints valid"
    if not problems:
        print(f"{printable(str(args.db))}: chain intact ({summary})")
        return 0
    for problem in problems:
        print(f"{printable(str(args.db))}: seq {problem.seq}: {problem.kind}: {problem.message}")
    print(
        f"{printable(str(args.db))}: chain BROKEN ({len(problems)} problem(s); {summary})",
        file=sys.stderr,
    )
    _hint_signers(problems)
    return 1


def _hint_signers(problems: Sequence[ChainProblem]) -> None:
    """After a rotation, lines signed by the older certificate are not verified by the new
    one alone: say how to give the verifier what it lacks (the problems stay reported)."""
    if any(p.message.endswith(UNKNOWN_SIGNER) for p in problems):
        print(
            "hint: checkpoints signed by a certificate not given (one from before a rotation?):"
            " pass it as another --cert, or the CA with --ca, or the agent's --config",
            file=sys.stderr,
        )


def _checkpoint_sources(
    args: argparse.Namespace,
) -> tuple[Path | None, list[bytes], bytes | None]:
    """The checkpoint file, signer certificates and CA (PEM) for ``audit verify``, if any.

    ``--config`` adds the agent's current certificate to any ``--cert`` given
    (older ones, from before a rotation) and its ``[tls] ca`` unless ``--ca``;
    for an agent whose identity comes from the Workload API, every SVID that
    signed (the signers file beside the checkpoints).
    """
    checkpoints, certs, ca = args.checkpoints, list(args.cert or []), args.ca
    extra: list[bytes] = []
    if args.config is not None:
        config = load_agent_config(args.config)
        checkpoints = checkpoints or config.checkpoint_file
        if isinstance(config.tls, WorkloadApiTls):
            extra = read_signers(signers_file(config.checkpoint_file))
        else:
            ca = ca or config.tls.ca
            if config.tls.cert not in certs:
                certs.append(config.tls.cert)
    pems = [load_pem_file(cert, "certificate") for cert in certs] + extra
    if (checkpoints is None) != (not pems):
        raise ConfigError("audit verify: --checkpoints and --cert go together (or give --config)")
    return checkpoints, pems, None if ca is None else load_pem_file(ca, "CA certificate")


def _policy_check(args: argparse.Namespace) -> int:
    policy = load_policy(args.file)
    document = policy.document
    print(
        f"{printable(str(args.file))}: ok ({len(document.grants)} grants, "
        f"{len(document.outbound)} outbound rules)"
    )
    now = datetime.now(UTC)
    for grant in document.grants:
        entries = ", ".join(str(entry) for entry in grant.capabilities)
        print(
            f"  {grant.peer}: {entries}; cap {grant.max_payload_bytes} bytes; "
            f"expires {grant.expires_at.isoformat()}"
            + (f"; max risk {grant.max_risk.value}" if grant.max_risk else "")
            + "".join(f"; {limit}" for limit in _limits_of(grant))
        )
    for grant in document.grants:
        if grant.expires_at <= now:
            print(
                f"warning: grant of {grant.peer} expired {grant.expires_at.isoformat()}: "
                "its calls are refused GRANT_EXPIRED",
                file=sys.stderr,
            )
    return 0


def _limits_of(grant: PeerGrant) -> list[str]:
    """The per-peer limits a grant sets, as written in the policy file."""
    shown = [
        ("max_calls_per_second", grant.max_calls_per_second),
        ("burst", grant.burst),
        ("max_in_flight", grant.max_in_flight),
    ]
    return [f"{key} {value:g}" for key, value in shown if value is not None]


_VERIFY_ONLY = ("checkpoints", "cert", "ca", "config")
"""``audit`` options that only ``audit verify`` reads."""
_LISTING_ONLY = ("refusals", "peer", "capability", "since", "trace", "summary", "json")
"""``audit`` options that only listing reads (``verify`` checks the whole chain)."""


def _audit(args: argparse.Namespace) -> int:
    if args.action != "verify":  # listing would ignore them: the log looks checked, unchecked
        given = [f"--{name}" for name in _VERIFY_ONLY if getattr(args, name) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: used only by audit verify "
                "(a2a-gateway audit verify --db ...); listing records checks no checkpoint"
            )
    if args.action == "verify":  # a filter would read as "verified these records only"
        given = [f"--{name}" for name in _LISTING_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: audit verify checks the whole chain and prints no "
                "records; list them without verify"
            )
    if args.follow:
        if args.action == "verify" or args.summary:
            raise ConfigError("--follow prints records; it does not go with verify or --summary")
        return audit_follow.follow(args)
    if args.action == "verify":
        return _audit_verify(args)
    if open_audit_reader(args.db).many_chains:
        return _audit_agents(args)
    if args.agent is not None:
        raise ConfigError("--agent: a SQLite audit log holds one agent; give a PostgreSQL DSN")
    records = query_records(open_audit_reader(args.db), audit_follow.audit_filter(args))
    if not records and not args.json:
        print(_no_records(args))
        return 0
    if args.summary:
        rows = summarize(records)
        text = format_summary_json(rows) if args.json else format_summary(rows)
    else:
        text = format_json_lines(records) if args.json else format_table(records)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return 0
