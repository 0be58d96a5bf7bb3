"""``policy backtest`` (old name ``policy replay``) and ``policy explain``: know what a
policy decides before it is live."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.admin.policy_backtest import (
    REGISTRY_STEPS,
    backtest,
    changes_as_json,
    decide,
    reasons_in,
)
from gateway.audit import parse_since, query_records
from gateway.audit.filter import AuditFilter
from gateway.config import load_agent_config
from gateway.display import json_for_terminals, printable
from gateway.errors import AgentConfigError, ConfigError
from gateway.postgres.dsn import StoreLocation
from gateway.storage import location, open_audit_reader
from policies.grants import MAX_PAYLOAD_CEILING
from policies.policy_file import load_policy
from policies.users import OnBehalfOf

EXIT_REFUSED = 1


def add_actions(policy_sub: Any) -> None:
    """Register ``backtest`` (alias ``replay``, its old name) and ``explain`` under ``policy``."""
    backtest_parser = policy_sub.add_parser(
        "backtest",
        aliases=["replay"],
        help="re-decide recorded calls under a candidate policy; list what changes "
        "(old name: replay)",
    )
    backtest_parser.add_argument(
        "--db",
        type=store_location,
        required=True,
        help="audit log: SQLite file, or postgresql://... (the shared table)",
    )
    backtest_parser.add_argument(
        "--agent",
        help="PostgreSQL: whose calls to backtest (SPIFFE ID; default: --config's id)",
    )
    backtest_parser.add_argument("--policy", type=Path, required=True, help="candidate policy")
    backtest_parser.add_argument("--since", help="only calls this recent, e.g. 24h, 7d")
    backtest_parser.add_argument(
        "--config",
        type=Path,
        help="agent config: load its capability modules to judge the version and risk steps",
    )
    backtest_parser.add_argument("--json", action="store_true", help="exact JSON")
    backtest_parser.set_defaults(run=_backtest)

    explain = policy_sub.add_parser(
        "explain", help="the decision for one call and the step that makes it"
    )
    explain.add_argument("--policy", type=Path, required=True, help="policy file (TOML)")
    explain.add_argument("--peer", required=True, help="caller's SPIFFE ID")
    explain.add_argument("capability", help="NAME or NAME@CONSTRAINT")
    explain.add_argument("--size", type=byte_count, default=0, help="payload bytes (default 0)")
    explain.add_argument(
        "--config", type=Path, help="agent config: judge versions and risks with its capabilities"
    )
    explain.add_argument("--user", help="the subject of the user the call acts for")
    explain.add_argument(
        "--user-claims", type=json_object, help='the user\'s claims, JSON: {"groups": ["x"]}'
    )
    explain.add_argument(
        "--input", type=json_object, help="the call's input (JSON), for conditions reading it"
    )
    explain.add_argument("--json", action="store_true", help="exact JSON")
    explain.set_defaults(run=_explain)


def json_object(text: str) -> dict[str, object]:
    """An argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not JSON") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


def byte_count(text: str) -> int:
    """An argparse type: a size in bytes, 0 up to the largest payload any grant may allow."""
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}") from None
    if not 0 <= size <= MAX_PAYLOAD_CEILING:
        raise argparse.ArgumentTypeError(f"must be 0..{MAX_PAYLOAD_CEILING} bytes, not {size}")
    return size


def store_location(text: str) -> StoreLocation:
    """An argparse type: a PostgreSQL DSN, or else a path to a SQLite file."""
    return location(text)


def registry_of(config_path: Path | None) -> CapabilityRegistry | None:
    """The capabilities an agent config's modules register (None without a config).

    Modules get a throw-away state folder: a backtest never touches the agent's state.
    Upstream capabilities are not loaded (they need the agent's key).
    """
    if config_path is None:
        return None
    config = load_agent_config(config_path)
    registry = CapabilityRegistry()
    with tempfile.TemporaryDirectory(prefix="a2agw-backtest-") as scratch:
        try:
            load_capability_modules(
                config.modules,
                registry,
                AgentEnvironment(config.id, Path(scratch)),
                config.module_dir,
            )
        except CapabilityModuleError as err:
            raise AgentConfigError(str(err)) from err
    return registry


def _backtest(args: argparse.Namespace) -> int:
    if args.policy_command == "replay":
        # "replay" now means replay protection only; the old name keeps working.
        print("warning: `policy replay` is deprecated; use `policy backtest`", file=sys.stderr)
    candidate = load_policy(args.policy)
    registry = registry_of(args.config)
    since = parse_since(args.since) if args.since is not None else None
    agent = args.agent
    if open_audit_reader(args.db).many_chains:
        if agent is None and args.config is not None:
            agent = load_agent_config(args.config).id
        if agent is None:
            command = f"policy {args.policy_command}"
            raise ConfigError(f"{command} --db postgresql://...: name the agent with --agent ID")
    elif agent is not None:
        raise ConfigError("--agent: a SQLite audit log holds one agent; give a PostgreSQL DSN")
    recorded = query_records(open_audit_reader(args.db), AuditFilter(agent=agent, since=since))
    report = backtest(recorded, candidate, registry)
    if args.json:
        text = json.dumps(changes_as_json(report), sort_keys=True, ensure_ascii=False)
        print(json_for_terminals(text))
        return 0
    print(
        f"{report.considered} recorded policy decisions re-decided under "
        f"{printable(str(args.policy))}; {len(report.changes)} would change"
    )
    if report.skipped_steps:
        print(
            f"not judged without --config: {', '.join(report.skipped_steps)} "
            f"({report.not_judged} refusal(s) by them left as recorded)"
        )
    print(f"{report.not_policy} record(s) are not policy decisions and were left alone")
    rows = [["peer", "capability", "change", "calls", "now", "first", "last"]]
    for (peer, capability, direction), changes in report.groups().items():
        times = [change.record.time_unix_ms for change in changes]
        rows.append(
            [
                printable(peer),
                printable(capability),
                direction,
                str(len(changes)),
                printable(reasons_in(changes)),
                _iso(min(times)),
                _iso(max(times)),
            ]
        )
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _explain(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    registry = registry_of(args.config)
    name, _, constraint_text = args.capability.partition("@")
    try:
        constraint = VersionConstraint.parse(constraint_text)
    except VersionSyntaxError as err:
        raise ConfigError(f"version constraint: {err}") from err
    verdict = decide(
        policy,
        registry,
        peer_id=args.peer,
        capability=name,
        constraint=constraint,
        payload_size=args.size,
        now=datetime.now(UTC),
        user=_user(args),
        payload=args.input,
    )
    if args.json:
        data = {
            "decision": verdict.decision,
            "reason": verdict.reason,
            "step": verdict.step,
            "message": verdict.message,
            "skipped_steps": list(verdict.skipped),
        }
        print(json_for_terminals(json.dumps(data, sort_keys=True, ensure_ascii=False)))
    elif verdict.decision == "allow":
        print(f"allow: every policy step passed for {printable(args.peer)} {printable(name)}")
    else:
        print(f"refuse {verdict.reason} at step {verdict.step}: {printable(verdict.message)}")
    if verdict.skipped and not args.json:
        registry_steps = [step for step in verdict.skipped if step in REGISTRY_STEPS]
        others = [step for step in verdict.skipped if step not in REGISTRY_STEPS]
        if registry_steps:
            print(f"not judged without --config: {', '.join(registry_steps)}", file=sys.stderr)
        if others:
            print(f"not judged: {', '.join(others)}", file=sys.stderr)
    return 0 if verdict.decision == "allow" else EXIT_REFUSED


def _user(args: argparse.Namespace) -> OnBehalfOf | None:
    """The user ``--user`` and ``--user-claims`` describe (claims alone name ``sub``)."""
    claims = dict(args.user_claims or {})
    subject = args.user or claims.get("sub")
    if not subject:
        if claims:
            raise ConfigError("--user-claims: name the user with --user or a sub claim")
        return None
    claims["sub"] = str(subject)
    return OnBehalfOf.of(str(subject), "", claims, (printable(args.peer),))


def _iso(time_unix_ms: int) -> str:
    moment = datetime.fromtimestamp(time_unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
