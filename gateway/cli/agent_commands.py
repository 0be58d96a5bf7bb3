"""Commands that run or talk to an agent: serve, describe, call, card, demo."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from capabilities.versions import VersionConstraint, VersionSyntaxError
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig, TlsFiles, WorkloadApiTls, load_agent_config
from gateway.config.addresses import https_base_url_problem, split_host_port
from gateway.display import printable
from gateway.errors import AgentConfigError, ConfigError
from gateway.local.regular_files import read_regular_file
from gateway.postgres.dsn import is_dsn, redact_credentials
from gateway.runtime.agent import Agent
from gateway.runtime.instance_lock import InstanceLock
from gateway.runtime.supervisor import Supervisor, check_workers
from gateway.runtime.worker_ports import ready_line, worker_config
from gateway.storage import connection_source, location
from gateway.telemetry.json_logs import name_agent
from gateway.transport.svid_checks import check_material
from gateway.transport.tls import TlsMaterial
from gateway.transport.workload_api import WorkloadApiFeed
from policies.grants import MAX_PAYLOAD_CEILING


def add_commands(commands: Any) -> None:
    """Register serve, describe, call, card and demo."""
    serve = commands.add_parser("serve", help="run an agent until interrupted")
    serve.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    # Set by the supervisor of ``workers > 1`` (gateway.runtime.supervisor), not by people.
    serve.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--https-port", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(run=_serve)

    describe = commands.add_parser("describe", help="what a peer lets this agent call")
    describe.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    describe.add_argument("--peer", required=True, help="peer SPIFFE ID from [[peers]]")
    describe.add_argument("--json", action="store_true", help="print JSON")
    describe.set_defaults(run=_describe)

    call = commands.add_parser("call", help="invoke a capability on a peer")
    call.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    call.add_argument("--peer", required=True, help="peer SPIFFE ID from [[peers]]")
    call.add_argument("capability", help="NAME or NAME@CONSTRAINT")
    call.add_argument(
        "--input", required=True, help="JSON text, or @FILE (a regular file, at most 4 MiB)"
    )
    call.add_argument("--timeout", type=positive_seconds, default=10.0, help="seconds (default 10)")
    call.add_argument(
        "--idempotency-key",
        default="",
        metavar="KEY",
        help="run a write at most once per KEY: a retry gets the stored answer",
    )
    call.set_defaults(run=_call)

    card = commands.add_parser(
        "card", help="print this agent's public A2A card (JSON; no skills) for registries"
    )
    card.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    card.add_argument(
        "--url",
        type=dial_address,
        help="HOST:PORT peers dial (default: [a2a] grpc_address or the listen address)",
    )
    card.add_argument(
        "--https-url",
        type=https_base_url,
        help="https://HOST[:PORT] of the HTTP bindings (default: [a2a] http_url or http_listen)",
    )
    card.set_defaults(run=_card)

    demo = commands.add_parser("demo", help="three agents on loopback: allowed calls and refusals")
    demo.add_argument(
        "--postgres",
        metavar="DSN",
        help="keep the three agents' audit and state in this PostgreSQL database",
    )
    demo.set_defaults(run=_demo)


def _serve(args: argparse.Namespace) -> int:
    config = load_agent_config(args.config)
    name_agent(config.id)
    check_workers(config)
    if args.worker is not None:  # the supervisor holds the lock and passed it on
        return asyncio.run(_serve_agent(args, config))
    lock = InstanceLock.acquire(config.state_dir)  # before any state is opened
    try:
        if config.workers > 1:
            return Supervisor(args.config, config, lock).run()  # signals need the main thread
        return asyncio.run(_serve_agent(args, config))
    finally:
        lock.release()


async def _serve_agent(args: argparse.Namespace, config: AgentConfig) -> int:
    """Serve until SIGINT/SIGTERM. A start that fails (a taken port, a bad file) has
    stopped what it started when its error reaches the CLI's one ``error:`` line."""
    config = worker_config(config, args.port, args.https_port)
    async with Agent(config, worker=args.worker or 0) as agent:
        agent.install_reload_signal()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if args.worker is None:
            if agent.https_url:
                print(f"a2a https on {agent.https_url}", flush=True)
            if agent.mcp_url:
                print(f"mcp on {agent.mcp_url}", flush=True)
            if agent.console is not None:
                print(f"console on {agent.console.url}", flush=True)
            print(f"{agent.config.id} serving on {agent.address}", flush=True)
            await stop.wait()
        else:
            print(ready_line(args.worker, agent.address, agent.https_url), flush=True)
            orphan_watch = asyncio.create_task(_stop_when_orphaned(stop))
            await stop.wait()
            orphan_watch.cancel()
    return 0


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A worker whose supervisor is gone (SIGKILL) stops instead of serving unwatched."""
    parent = os.getppid()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()
        if os.getppid() != parent:
            stop.set()


def _client(config_path: Path, peer_id: str) -> PeerClient:
    config = load_agent_config(config_path)
    if isinstance(config.tls, WorkloadApiTls):  # the SVID this workload is given now
        tls = WorkloadApiFeed(config.id, config.tls).first
    else:
        tls = TlsMaterial.from_files(config.tls.ca, config.tls.cert, config.tls.key)
        try:  # as serve checks it: an expired or mismatched SVID is ours, not the peer's fault
            check_material(tls, config.id, datetime.now(UTC))
        except ConfigError as err:
            raise AgentConfigError(f"certificate {config.tls.cert}: {err.message}") from err
    return PeerClient(peer_id, config.peer(peer_id).address, tls)


async def _describe(args: argparse.Namespace) -> int:
    async with _client(args.config, args.peer) as client:
        description = await client.describe()
    if args.json:
        print(
            json.dumps(
                {
                    "agent_id": description.agent_id,
                    "protocol_version": description.protocol_version,
                    "max_payload_bytes": description.max_payload_bytes,
                    "grant_expires_at": description.grant_expires_at,
                    "capabilities": [
                        {
                            "name": c.name,
                            "version": c.version,
                            "risk": c.risk,
                            "timeout_seconds": c.timeout_seconds,
                            "idempotent": c.idempotent,
                            "description": c.description,
                            "input_schema": c.input_schema,
                            "output_schema": c.output_schema,
                            "preconditions": list(c.preconditions),
                            "examples": list(c.examples),
                        }
                        for c in description.capabilities
                    ],
                },
                indent=2,
            )
        )
        return 0
    # Every text field here is the peer's to choose: escaped before it reaches a terminal.
    print(
        printable(
            f"{description.agent_id} ({description.protocol_version}); "
            f"payload cap {description.max_payload_bytes} bytes; "
            f"grant expires {description.grant_expires_at}"
        )
    )
    if not description.capabilities:
        print("  no capability here is granted to this agent")
    for c in description.capabilities:
        key, risk = printable(f"{c.name}@{c.version}"), printable(c.risk)
        print(f"  {key:<28} {risk:<8} {c.timeout_seconds:>5g}s  {printable(c.description)}")
    return 0


def _read_input(text: str) -> bytes:
    """``--input``: the JSON text, or the bytes of the regular file ``@FILE`` names (a FIFO
    or device is refused, not waited on or read for ever, like every file an operator
    names); a file over the largest payload any grant allows is refused unsent, and so is
    anything that is not JSON (a usage error here, not a refusal from the peer)."""
    payload = _input_bytes(text)
    where = f"input file {text[1:]}" if text.startswith("@") else "--input"
    try:
        json.loads(payload)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: not UTF-8 (byte {err.start + 1})") from err
    except json.JSONDecodeError as err:  # the position only: the text may be anything
        raise ConfigError(
            f"{where}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from err
    except RecursionError as err:
        raise ConfigError(f"{where}: JSON nested too deep to read") from err
    return payload


def _input_bytes(text: str) -> bytes:
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            payload = read_regular_file(path, MAX_PAYLOAD_CEILING + 1)
        except OSError as err:
            raise ConfigError(f"input file {path}: {err.strerror or err}") from err
        if len(payload) > MAX_PAYLOAD_CEILING:
            raise ConfigError(
                f"input file {path}: larger than {MAX_PAYLOAD_CEILING} bytes, "
                "the most any grant allows"
            )
        return payload
    return text.encode()


async def _call(args: argparse.Namespace) -> int:
    name, _, constraint = args.capability.partition("@")
    try:  # checked here: a typo is the caller's mistake, not worth a round trip
        VersionConstraint.parse(constraint)
    except VersionSyntaxError as err:
        raise ConfigError(f"{args.capability}: {err}") from err
    payload = _read_input(args.input)
    async with _client(args.config, args.peer) as client:
        result = await client.invoke(
            name,
            payload,
            constraint=constraint,
            timeout=args.timeout,
            idempotency_key=args.idempotency_key,
        )
    print(json.dumps(result.output(), indent=2, sort_keys=True))
    served = printable(f"{result.capability}@{result.served_version}")  # the peer's text
    print(
        f"served {served} evidence sha256:"
        f"{printable(result.evidence_sha256)}{' (replayed)' if result.remembered else ''}",
        file=sys.stderr,
    )
    return 0


MAX_CALL_SECONDS = 86400.0
"""The longest ``call --timeout`` (a day; a capability's own timeout is at most an hour)."""


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above zero, at most ``MAX_CALL_SECONDS``
    (else a usage error: a deadline further off overflows the transport's clock)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    if value > MAX_CALL_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at most {MAX_CALL_SECONDS:g} seconds")
    return value


def dial_address(text: str) -> str:
    """An argparse type: ``HOST:PORT`` with a port 1..65535, as ``[a2a] grpc_address`` is."""
    try:
        split_host_port(text, lowest_port=1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def https_base_url(text: str) -> str:
    """An argparse type: ``https://HOST[:PORT]`` (see ``https_base_url_problem``)."""
    problem = https_base_url_problem(text)
    if problem is not None:
        shown = redact_credentials(repr(text))
        raise argparse.ArgumentTypeError(f"{shown}: expected https://HOST[:PORT] ({problem})")
    return text


def _card(args: argparse.Namespace) -> int:
    from gateway.server.a2a import public_card
    from gateway.server.a2a.card import CardIssuer, card_json
    from gateway.server.a2a.card_signing import card_signer
    from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH

    config = load_agent_config(args.config)
    if not isinstance(config.tls, TlsFiles):
        raise AgentConfigError(
            f"{args.config}: card signs with the agent's key, which a Workload API identity "
            "holds only while it serves: fetch /.well-known/agent-card.json from the agent"
        )
    tls = TlsMaterial.from_files(config.tls.ca, config.tls.cert, config.tls.key)
    listen = config.a2a.http_listen
    base = args.https_url or config.a2a.http_url or (f"https://{listen}" if listen else "")
    issuer = CardIssuer(
        args.url or config.a2a.grpc_address or config.listen,
        jsonrpc_url=f"{base}{JSONRPC_PATH}" if base else "",
        rest_url=f"{base}{REST_PATH}" if base else "",
        v0_3=config.a2a.v0_3_compat,
        sign=card_signer(config.id, lambda: tls),  # signed as the served card is
    )
    print(json.dumps(card_json(public_card(config.id, issuer)), indent=2))  # the 1.0 form
    return 0


async def _demo(args: argparse.Namespace) -> int:
    from gateway.devtools.demo import run_demo

    with contextlib.suppress(BrokenPipeError):
        if args.postgres is not None:
            _check_demo_database(args.postgres)
        return await run_demo(args.postgres)
    return 0


def _check_demo_database(text: str) -> None:
    """``demo --postgres``: a DSN the demo can connect to now, else a usage error (exit 2,
    as ``db init`` says it); the agents would otherwise fail to start with
    ``refused: AUDIT_UNAVAILABLE`` (exit 1), which nobody refused."""
    if not is_dsn(text):
        raise ConfigError(f"--postgres {text!r}: expected postgresql://...")
    database = connection_source(location(text))
    try:
        with database.connect(timeout=10):
            pass
    except psycopg.Error as err:
        raise ConfigError(f"--postgres {database}: cannot connect: {database.why(err)}") from err
