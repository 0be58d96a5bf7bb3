"""``a2a-gateway idempotency``: list keys, resolve or release one left in doubt."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from gateway.config import AgentConfig, load_agent_config
from gateway.errors import ConfigError
from gateway.inbound.idempotency.operator import KeyEntry, OutputCheck, Resolution
from gateway.storage import open_key_admin


def add_commands(commands: Any) -> None:
    """Register ``idempotency list`` and ``idempotency resolve``."""
    parser = commands.add_parser("idempotency", help="list keys; resolve or release keys in doubt")
    sub = parser.add_subparsers(dest="idempotency_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="the agent's idempotency keys")
    listing.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    listing.add_argument("--in-doubt", action="store_true", help="only keys in doubt")
    listing.add_argument("--json", action="store_true", help="JSON lines")
    listing.set_defaults(run=_list)

    resolve = sub.add_parser(
        "resolve",
        help="settle a key in doubt: --done with the observed output, or --release",
        description="Only a key in doubt is changed (never one a running attempt holds). "
        "--done stores OUTPUT as the key's answer: a retry gets it replayed and the write "
        "never runs again. --release frees the key: the next call with it RUNS THE WRITE "
        "AGAIN, so release only after checking the write did not happen. Both are audited.",
    )
    resolve.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    resolve.add_argument("--peer", required=True, help="SPIFFE ID of the peer that used the key")
    resolve.add_argument("--capability", required=True, help="capability name")
    resolve.add_argument("--key", required=True, help="the idempotency key")
    action = resolve.add_mutually_exclusive_group(required=True)
    action.add_argument("--done", action="store_true", help="mark done with --output-json")
    action.add_argument("--release", action="store_true", help="free the key (write may rerun)")
    resolve.add_argument("--output-json", help="with --done: the outcome observed (JSON object)")
    resolve.add_argument("--reason", required=True, help="what you checked (audited)")
    resolve.set_defaults(run=_resolve)


def _list(args: argparse.Namespace) -> int:
    config = load_agent_config(args.config)
    entries = open_key_admin(config).keys(in_doubt_only=args.in_doubt)
    if args.json:
        for entry in entries:
            print(json.dumps(entry.to_json_dict(), sort_keys=True))
        return 0
    if not entries:
        print("no keys" + (" in doubt" if args.in_doubt else ""))
        return 0
    print(f"{'state':<9} {'updated (UTC)':<20} {'peer':<40} {'capability':<20} key")
    for entry in entries:
        print(_row(entry))
    return 0


def _row(entry: KeyEntry) -> str:
    when = datetime.fromtimestamp(entry.updated_unix_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{entry.state:<9} {when:<20} {entry.peer!s:<40} {entry.capability!s:<20} {entry.key!r}"


def _resolve(args: argparse.Namespace) -> int:
    config = load_agent_config(args.config)
    ident = (args.peer, args.capability, args.key)
    keys = open_key_admin(config)
    if args.done:
        if args.output_json is None:
            raise ConfigError("--done needs --output-json '{...}': the outcome you observed")
        try:
            output = json.loads(args.output_json)
        except ValueError as err:
            raise ConfigError(f"--output-json is not JSON: {err}") from err
        done = keys.resolve_done(ident, output, args.reason, check_output=_contract_check(config))
    else:
        if args.output_json is not None:
            raise ConfigError("--output-json goes with --done, not --release")
        done = keys.release(ident, args.reason)
    print(_said(done))
    return 0


def _contract_check(config: AgentConfig) -> OutputCheck:
    """Checks an output against the contract the agent's modules register for the key."""
    registry = CapabilityRegistry()
    try:
        load_capability_modules(
            config.modules,
            registry,
            AgentEnvironment(config.id, config.state_dir),
            config.module_dir,
        )
    except CapabilityModuleError as err:
        raise ConfigError(str(err)) from err

    def check(entry: KeyEntry, output: dict[str, Any]) -> dict[str, Any]:
        found = [
            cap
            for cap in registry
            if cap.name == entry.capability and str(cap.version) == entry.served_version
        ]
        if not found:
            raise ConfigError(
                f"{entry.capability} {entry.served_version or '(version unknown)'} is not "
                "registered by this agent's modules, so the output cannot be checked"
            )
        contract = found[0].contract
        try:
            checked = contract.output_model.model_validate(output, strict=False)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(output)'}: {e['type']}"
                for e in err.errors(include_url=False, include_input=False)[:5]
            )
            raise ConfigError(
                f"--output-json does not match the output contract of {contract.key}: {problems}"
            ) from err
        result: dict[str, Any] = checked.model_dump(mode="json")
        return result

    return check


def _said(done: Resolution) -> str:
    entry = done.entry
    name = f"key {entry.key!r} of {entry.peer} for {entry.capability}"
    if done.action == "resolved":
        what = (
            f"resolved: {name} marked done with the given output "
            f"({done.output_size} bytes, sha256 {done.output_sha256}); "
            "a retry with this key gets that answer, replayed"
        )
    else:
        what = f"released: {name} freed; the next call with this key runs the write again"
    return f"{what} (audit record seq {done.audit_seq})"
