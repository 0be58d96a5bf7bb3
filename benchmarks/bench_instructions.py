"""Per-call cost in machine instructions (callgrind), the gateway against raw gRPC.

Run ``python benchmarks/bench_instructions.py`` (about 2-3 minutes on 2 cores).
It re-runs itself under ``valgrind --tool=callgrind``; ``--no-valgrind`` runs the
same phases natively (a smoke run, or to see the CPU time per call).

Why instructions: CPU time per call moves by 10-30% on a shared 2-core VM;
the instruction count of the same calls moves by well under 1% between runs,
so a change of a few percent in the gateway's own work can be seen.

One process, one event loop, everything real: a fresh CA and ``server`` /
``caller`` SVIDs, a policy granting ``caller`` only ``text.echo``, a real gateway
:class:`~gateway.runtime.agent.Agent` (mTLS, identity from the certificate, policy,
limits, replay window, input/output validation, audit log with
``audit_sync = "full"``) and the raw ``grpc.aio`` echo server of
``bench_invoke.py`` (same credentials, options and messages), both on loopback,
and a client with one channel per target. Phases, each ``--calls`` calls with
``--in-flight`` of them at once, each ended by flushing the audit log so the
writer thread's work lands in the phase that queued it:

* ``raw``: raw echo over gRPC (client + server + TLS);
* ``raw_refused``: a raw server that only answers the gateway's rich
  ``CAPABILITY_NOT_GRANTED`` status (built once): what a refusal costs gRPC;
* ``gateway``: the gateway's allowed ``text.echo`` over gRPC;
* ``refused``: ``text.search``, not granted (``CAPABILITY_NOT_GRANTED``, its
  record committed before the answer);
* ``handler`` / ``handler_refused``: the same calls given straight to the
  agent's ``InvokeHandler`` with the caller's real certificate (the servicer's
  work without gRPC: what the gateway itself adds, audit writer included);
* one phase per hot pure function (identity from the certificate, one audit
  record checked, chained and hashed, one replay-window sighting, input
  validation of the ``text.echo`` contract).

The phases are cut apart with ``--dump-before=getpgrp``: the script calls
``os.getpgrp()`` (which nothing else here calls) between phases, and callgrind
writes the counts so far to a new part file and starts from zero. The whole
process is counted (every thread), so ``gateway - raw`` over gRPC is the
server-side work the gateway adds per call (same client, same transport), and
``refused - raw_refused`` what it adds to a refusal.
Each part is read with ``callgrind_annotate --inclusive=yes``; the report
lists the top inclusive C functions of the gRPC gateway and handler phases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import bench_invoke
from bench_invoke import (
    ALLOWED_CAPABILITY,
    REFUSED_CAPABILITY,
    Target,
    Workspace,
    echo_payload,
    make_workspace,
    open_targets,
    start_raw_server,
)
from grpc import aio

from capabilities.versions import VersionConstraint
from gateway.audit.chain import GENESIS_HASH, chained_row
from gateway.audit.record import AuditRecord, checked_fields
from gateway.errors import CapabilityNotGranted
from gateway.inbound.call import InvokeCall
from gateway.inbound.replay.mmap import ReplayTable
from gateway.runtime.agent import Agent
from gateway.transport.status import to_grpc_status
from gateway.transport.tls import TlsMaterial, channel_options, server_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from policies.identity import spiffe_id_from_pem

# Under callgrind a call takes ~50x longer: give every call room (read at call time).
bench_invoke.CALL_TIMEOUT_SECONDS = 600.0

MARK = "getpgrp"
"""The libc function whose call cuts the phases apart under callgrind."""
CALLGRIND_OPTIONS = (
    "--tool=callgrind",
    f"--dump-before={MARK}",
    "--dump-instr=no",
    "--collect-jumps=no",
)
TOP_FUNCTIONS = 12


class RawRefusingServicer(gateway_pb2_grpc.PeerGatewayServicer):
    """The refusal's baseline: the gateway's rich CAPABILITY_NOT_GRANTED status, built once.

    What a refusal costs gRPC itself (the abort, the status details, the
    client's error), so ``refused - raw_refused`` is the gateway's own share.
    """

    def __init__(self) -> None:
        self._status = to_grpc_status(CapabilityNotGranted("capability not granted"))

    async def Invoke(
        self, request: gateway_pb2.InvokeRequest, context: aio.ServicerContext[object, object]
    ) -> gateway_pb2.InvokeResponse:
        """Refuse, as the gateway does, without deciding anything."""
        await context.abort_with_status(self._status)
        raise AssertionError("abort_with_status returned")


async def start_refusing_server(tls: TlsMaterial) -> tuple[aio.Server, int]:
    """The refusing baseline on 127.0.0.1, built like the raw echo server."""
    server = aio.server(options=server_options())
    gateway_pb2_grpc.add_PeerGatewayServicer_to_server(  # type: ignore[no-untyped-call]
        RawRefusingServicer(), server
    )
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    return server, port


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One measured phase: its name and how it makes ``n`` calls."""

    name: str
    run: Callable[[int], Awaitable[None]]


def mark() -> None:
    """End the current phase (a callgrind dump under valgrind; nothing natively)."""
    os.getpgrp()


async def _concurrently(calls: int, in_flight: int, one: Callable[[int], Awaitable[None]]) -> None:
    numbers = iter(range(calls))

    async def worker() -> None:
        for n in numbers:
            await one(n)

    await asyncio.gather(*(worker() for _ in range(in_flight)))


def grpc_phase(target: Target, in_flight: int) -> PhaseSpec:
    """Calls of ``target`` over gRPC; an unexpected outcome raises at the end."""

    async def run(calls: int) -> None:
        async def one(_n: int) -> None:
            await target.call()

        await _concurrently(calls, in_flight, one)
        if target.errors:
            raise RuntimeError(f"{target.name}: {target.errors[:3]}")

    return PhaseSpec(target.name, run)


def handler_phase(
    name: str, agent: Agent, cert: bytes, capability: str, payload: bytes, in_flight: int
) -> PhaseSpec:
    """Calls given straight to the agent's InvokeHandler with the caller's real certificate."""
    refused = capability == REFUSED_CAPABILITY
    sent = 0

    async def one(_n: int) -> None:
        nonlocal sent
        sent += 1
        call = InvokeCall(cert, f"{name}-{sent}", capability, "", payload, time.monotonic() + 30)
        try:
            outcome = await agent.handler.invoke(call)
        except CapabilityNotGranted:
            if refused:
                return
            raise
        if refused or outcome.payload != payload:
            raise RuntimeError(f"{name}: unexpected outcome")

    async def run(calls: int) -> None:
        await _concurrently(calls, in_flight, one)

    return PhaseSpec(name, run)


def pure_phases(agent: Agent, cert: bytes, payload: bytes) -> list[PhaseSpec]:
    """One phase per hot pure function of the call path, on the inputs a call gives it."""
    peer = spiffe_id_from_pem(cert)
    capability = agent.registry.resolve(ALLOWED_CAPABILITY, VersionConstraint.parse(""))
    assert capability is not None
    model = capability.contract.input_model
    record = AuditRecord(
        time_unix_ms=1_767_225_600_000,
        request_id="bench-1",
        peer_id=peer,
        capability=ALLOWED_CAPABILITY,
        version_constraint="",
        served_version="1.0.0",
        decision="allow",
        reason="OK",
        payload_size=len(payload),
        payload_sha256="ab" * 32,
        latency_ms=0.25,
        seq=1,
    )
    table = ReplayTable(None, capacity=1 << 16)
    sightings = 0

    async def identity(calls: int) -> None:
        for _ in range(calls):  # past the per-certificate cache: the parse itself
            spiffe_id_from_pem.__wrapped__(cert)

    async def audit_chain(calls: int) -> None:
        prev = GENESIS_HASH
        for _ in range(calls):
            prev = chained_row(prev, checked_fields(record))[1]

    async def replay(calls: int) -> None:
        nonlocal sightings
        for _ in range(calls):
            sightings += 1
            table.sight(peer, f"r-{sightings}")

    async def validate(calls: int) -> None:
        for _ in range(calls):
            model.model_validate_json(payload)

    return [
        PhaseSpec("identity_from_cert", identity),
        PhaseSpec("audit_record_chain", audit_chain),
        PhaseSpec("replay_sighting", replay),
        PhaseSpec("validate_input", validate),
    ]


def leaf_pem(chain: bytes) -> bytes:
    """The first certificate of a PEM chain: what gRPC hands the servicer as the peer's."""
    end = b"-----END CERTIFICATE-----"
    return chain[: chain.index(end) + len(end)] + b"\n"


async def run_phases(args: argparse.Namespace, base: Path) -> list[str]:
    """Start everything, warm up, run every phase between marks; returns the phase names."""
    ws: Workspace = make_workspace(base, args.payload_bytes)
    payload = echo_payload(args.payload_bytes)
    agent = Agent(ws.config)
    await agent.start(watch_policy=False)
    raw_server, raw_port = await start_raw_server(agent.tls)
    refusing_server, refusing_port = await start_refusing_server(agent.tls)
    targets = open_targets(ws, {"raw_port": raw_port, "gateway_port": agent.port}, payload)
    targets.insert(
        1,
        Target(
            "raw_refused",
            aio.secure_channel(
                f"127.0.0.1:{refusing_port}",
                ws.caller_tls.channel_credentials(),
                options=channel_options(ws.config.id),
            ),
            REFUSED_CAPABILITY,
            payload,
            expect_refusal=True,
        ),
    )
    cert = leaf_pem(ws.caller_tls.cert_pem)
    phases = [
        *(grpc_phase(target, args.in_flight) for target in targets),
        handler_phase("handler", agent, cert, ALLOWED_CAPABILITY, payload, args.in_flight),
        handler_phase("handler_refused", agent, cert, REFUSED_CAPABILITY, payload, args.in_flight),
        *pure_phases(agent, cert, payload),
    ]
    try:
        for phase in phases:  # TLS sessions, caches, lazily built encoders
            await phase.run(args.warmup)
        await agent.audit.flush()
        for phase in phases:
            mark()
            await phase.run(args.calls)
            await agent.audit.flush()  # the writer's work belongs to the phase that queued it
        mark()
    finally:
        for target in targets:
            await target.channel.close()
        await raw_server.stop(1.0)
        await refusing_server.stop(1.0)
        await agent.stop(1.0)
    return [phase.name for phase in phases]


def child_main(args: argparse.Namespace) -> None:
    """The measured process: runs the phases, then prints their names as JSON."""
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        names = asyncio.run(run_phases(args, Path(tmp)))
    print("PHASES " + json.dumps(names), flush=True)


# --- reading callgrind's output ---------------------------------------------


_TOTAL = re.compile(r"^\s*([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", re.MULTILINE)
_LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)\s*$")


def annotate(part: Path) -> tuple[int, list[tuple[int, str]]]:
    """(total instructions, inclusive counts by function, highest first) of one part file."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(part)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    total_match = _TOTAL.search(out)
    total = int(total_match.group(1).replace(",", "")) if total_match else 0
    functions: list[tuple[int, str]] = []
    body = out.split("file:function", 1)[-1]
    for line in body.splitlines():
        found = _LINE.match(line)
        if found:
            functions.append((int(found.group(1).replace(",", "")), found.group(2)))
    return total, functions


def short(function: str) -> str:
    """``file:function [object]`` -> ``function (object)``, shortened for a table."""
    function = re.sub(r"\s*\[[^\]]*/([^/\]]+)\]$", r" (\1)", function)
    return function.split(":", 1)[-1][:90]


@dataclass(frozen=True, slots=True)
class PhaseCount:
    """Instructions of one phase, read from its part file."""

    name: str
    calls: int
    total: int
    functions: list[tuple[int, str]]
    """Inclusive instructions by function."""

    @property
    def per_call(self) -> float:
        """Instructions per call, the whole process (every thread)."""
        return self.total / self.calls


def report(counts: dict[str, PhaseCount], args: argparse.Namespace) -> dict[str, object]:
    """The figures, as one JSON-ready dict."""
    per = {name: round(count.per_call) for name, count in counts.items()}
    raw, gateway, refused = per["raw"], per["gateway"], per["refused"]
    raw_refused = per["raw_refused"]
    return {
        "payload_bytes": args.payload_bytes,
        "calls_per_phase": args.calls,
        "in_flight": args.in_flight,
        "instructions_per_call": per,
        "gateway_added_per_call": gateway - raw,
        "refused_added_per_call": refused - raw_refused,
        "ratio_raw_over_gateway": round(raw / gateway, 3),
        "ratio_raw_refused_over_refused": round(raw_refused / refused, 3),
    }


def print_report(counts: dict[str, PhaseCount], figures: dict[str, object]) -> None:
    """The human-readable report."""
    print(
        f"Instructions per call (callgrind, whole process, every thread): payload "
        f"{figures['payload_bytes']} B, {figures['calls_per_phase']} calls per phase, "
        f"{figures['in_flight']} in flight\n"
    )
    print(f"{'phase':<22}{'instr/call':>14}")
    for name, count in counts.items():
        print(f"{name:<22}{count.per_call:>14,.0f}")
    print()
    print(
        f"gateway - raw (server-side work the gateway adds): {figures['gateway_added_per_call']:,}"
    )
    print(
        f"refused - raw_refused (what the gateway adds to a refusal): "
        f"{figures['refused_added_per_call']:,}"
    )
    print(
        f"raw / gateway: {figures['ratio_raw_over_gateway']}  raw_refused / refused: "
        f"{figures['ratio_raw_refused_over_refused']}\n"
    )
    for name in ("gateway", "handler"):
        count = counts[name]
        print(f"top inclusive functions of libraries and extensions, phase {name} (per call):")
        for value, function in library_functions(count.functions)[:TOP_FUNCTIONS]:
            print(f"  {value / count.calls:>12,.0f}  {short(function)}")
        print()


_LIBRARY = re.compile(
    r"libcrypto|libssl|sqlite|cygrpc|pydantic_core|_hashlib|_json|_upb|_cffi|_rust|psycopg"
)


def library_functions(functions: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The functions of OpenSSL, SQLite, gRPC core, pydantic-core, protobuf and the like.

    Python code runs inside the interpreter's eval loop, which callgrind sees
    as one recursive C function; the libraries it calls are where named costs
    show. Recursion cycles (``'2``) are left out.
    """
    return [(v, f) for v, f in functions if _LIBRARY.search(f) and "'" not in f]


def run_under_callgrind(args: argparse.Namespace) -> int:
    """Re-run this script as the measured child under callgrind, then read the parts."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("valgrind (callgrind) is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        out_file = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            *CALLGRIND_OPTIONS,
            f"--callgrind-out-file={out_file}",
            sys.executable,
            __file__,
            "--child",
            *child_arguments(args),
        ]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stdout, done.stderr[-4000:], sep="\n", file=sys.stderr)
            return 1
        names = json.loads(done.stdout.rsplit("PHASES ", 1)[1])
        parts = sorted(
            Path(tmp).glob("callgrind.out.*"), key=lambda part: int(part.suffix.lstrip("."))
        )
        # Part 1 is start-up and warm-up; parts 2.. are the phases, in order.
        if len(parts) < len(names) + 1:
            print(f"expected {len(names) + 1} callgrind parts, found {len(parts)}", file=sys.stderr)
            return 1
        counts = {}
        for name, part in zip(names, parts[1 : len(names) + 1], strict=True):
            total, functions = annotate(part)
            counts[name] = PhaseCount(name, args.calls, total, functions)
    figures = report(counts, args)
    figures["seconds_under_valgrind"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_report(counts, figures)
        print(f"(under callgrind: {figures['seconds_under_valgrind']} s)")
    return 0


def child_arguments(args: argparse.Namespace) -> list[str]:
    """The options the child needs, as command-line words."""
    return [
        f"--calls={args.calls}",
        f"--warmup={args.warmup}",
        f"--in-flight={args.in_flight}",
        f"--payload-bytes={args.payload_bytes}",
    ]


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per phase (default 300)")
    parser.add_argument("--warmup", type=int, default=40, help="warm-up calls per phase")
    parser.add_argument("--in-flight", type=int, default=32, help="calls at once (default 32)")
    parser.add_argument("--payload-bytes", type=int, default=256, help="JSON payload size")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--no-valgrind", action="store_true", help="run the phases natively (no counts)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    if args.no_valgrind:
        started = time.process_time()
        child_main(args)
        print(f"native run: {time.process_time() - started:.1f} s CPU (no instruction counts)")
        return 0
    return run_under_callgrind(args)


if __name__ == "__main__":
    sys.exit(main())
