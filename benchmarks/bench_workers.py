"""Workers benchmark: ``text.echo`` at 32 in flight against ``workers = 1`` vs ``workers = N``.

Run ``python benchmarks/bench_workers.py --help``. One run mints a PKI, writes
a policy granting ``caller`` ``text.echo`` and two agent configs that differ
only in ``workers`` (the N-worker one with ``pin_workers = true`` unless
``--no-pin``), both serving ``[a2a] http_listen`` too, and starts each agent
as ``a2a-gateway serve`` (the real supervisor and worker processes; full
audit). This process is the client, on each binding of ``--bindings``:

- ``grpc``: ``Invoke`` over ``--channels`` connections, 32 calls in flight
  across them;
- ``https``: A2A ``SendMessage`` over JSON-RPC (HTTPS, HTTP/1.1 keep-alive),
  32 connections with one call in flight each (HTTP/1.1 has no multiplexing).

The kernel spreads connections, not calls, over the workers. Each binding
keeps its calls in flight for ``--seconds``, alternating the two agents round
by round; medians of rounds are reported per binding with the ratio
calls/s(N workers) / calls/s(1 worker), the CPU per call of the serving
processes (supervisor and workers, from /proc) and of the client, each
worker's share of the server CPU (how evenly the kernel spread the
connections), and the calls/s that the CPU per call allows on idle CPUs.

The exit status is 0 whatever the ratio (a measurement, not a test) and 1
when a call failed or an audit log does not hold one record per call.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_a2a_http import JsonRpcTarget, jsonrpc_client, jsonrpc_params
from grpc import aio

from gateway.audit import query_records
from gateway.audit.filter import AuditFilter
from gateway.devtools.pki import IssuedIdentity, init_ca, issue
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial, channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from policies.grants import PolicyDocument
from policies.policy_file import render_policy

TRUST_DOMAIN = "bench.example"
CONCURRENCY = 32
TEXT = "x" * 245
PAYLOAD = json.dumps({"text": TEXT}, separators=(",", ":")).encode()  # 256 bytes
TARGET_RATIO = 1.3
_REQUEST_IDS = itertools.count()  # unique over rounds: a reused id is refused
START_TIMEOUT_SECONDS = 120.0
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def serving_pids(root: int) -> list[int]:
    """``root`` (the ``serve`` process) and its children (the workers, if any)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == root:
                children.append(int(entry.name))
    return [root, *sorted(children)]


def write_agent(
    base: Path, name: str, workers: int, server: IssuedIdentity, ca: Path, *, pin: bool
) -> Path:
    """An agent config (TOML) serving ``text.echo`` with ``workers`` processes."""
    state = base / f"{name}-state"
    text = "\n".join(
        [
            f"workers = {workers}",
            *(["pin_workers = true"] if pin and workers > 1 else []),
            f'id = "{server.spiffe_id}"',
            'listen = "127.0.0.1:0"',
            f'policy = "{base / "policy.toml"}"',
            f'audit_db = "{base / (name + "-audit.sqlite")}"',
            f'state_dir = "{state}"',
            "[tls]",
            f'ca = "{ca}"',
            f'cert = "{server.cert_path}"',
            f'key = "{server.key_path}"',
            "[a2a]",
            'http_listen = "127.0.0.1:0"',
            "",
        ]
    )
    path = base / f"{name}.toml"
    path.write_text(text)
    return path


@dataclass(frozen=True)
class Served:
    """One agent started by :func:`start`."""

    proc: subprocess.Popen[str]
    port: int
    """The gRPC port."""
    https_url: str
    """``https://HOST:PORT`` of the A2A HTTP bindings."""


def start(config: Path) -> Served:
    """``serve --config``; returns the process and where it serves once it does."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    https_url = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("a2a https on "):
            https_url = line.removeprefix("a2a https on ").strip()
        if " serving on " in line:
            return Served(proc, int(line.rsplit(":", 1)[1]), https_url)
    proc.kill()
    raise SystemExit(f"{config.name}: did not start serving")


@dataclass(frozen=True)
class Round:
    """One agent's share of one round."""

    calls: int
    untimed: int
    """Calls made before the clock started (connecting), audited all the same."""
    calls_per_s: float
    server_us_per_call: float
    """CPU of the supervisor and all workers (every thread) per call."""
    client_us_per_call: float
    worker_cpu_shares: list[float]
    """Each serving process's part of the server CPU (one entry with ``workers = 1``)."""


class Clock:
    """The server's and this process's CPU over one timed run."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = pids
        self._served = [cpu_seconds(pid) for pid in pids]
        self._client = time.process_time()
        self._started = time.monotonic()

    def round(self, done: int, untimed: int) -> Round:
        """The round of ``done`` calls since this clock started."""
        elapsed = time.monotonic() - self._started
        client_cpu = time.process_time() - self._client
        served = [
            cpu_seconds(pid) - before for pid, before in zip(self._pids, self._served, strict=True)
        ]
        total = sum(served) or 1e-9
        return Round(
            calls=done,
            untimed=untimed,
            calls_per_s=done / elapsed,
            server_us_per_call=total / done * 1e6,
            client_us_per_call=client_cpu / done * 1e6,
            worker_cpu_shares=[part / total for part in served[1:] or served],
        )


async def drive_https(
    url: str, pids: list[int], tls: TlsMaterial, server_id: str, args: argparse.Namespace
) -> Round:
    """32 connections, one JSON-RPC ``SendMessage`` in flight on each, for ``args.seconds``."""
    targets = [
        JsonRpcTarget("gateway", url + JSONRPC_PATH, jsonrpc_client(tls), server_id)
        for _ in range(CONCURRENCY)
    ]
    done = 0

    async def loop(target: JsonRpcTarget) -> None:
        nonlocal done
        while time.monotonic() < end and not target.errors:
            await target.call(jsonrpc_params(TEXT), TEXT)
            done += 1

    # Connected (TLS handshakes done) before the clock starts: one call each.
    await asyncio.gather(*(target.call(jsonrpc_params(TEXT), TEXT) for target in targets))
    clock = Clock(pids)
    end = time.monotonic() + args.seconds
    await asyncio.gather(*(loop(target) for target in targets))
    measured = clock.round(done, CONCURRENCY)
    for target in targets:
        await target.close()
    errors = [error for target in targets for error in target.errors]
    if errors:
        raise SystemExit(f"call failed: {errors[0]}")
    return measured


async def drive(
    port: int, pids: list[int], tls: TlsMaterial, server_id: str, args: argparse.Namespace
) -> Round:
    """32 in flight over ``args.channels`` connections for ``args.seconds``."""
    channels = [
        aio.secure_channel(
            f"127.0.0.1:{port}",
            tls.channel_credentials(),
            options=[*channel_options(server_id), ("grpc.use_local_subchannel_pool", 1)],
        )
        for _ in range(args.channels)
    ]
    stubs = [gateway_pb2_grpc.PeerGatewayStub(c) for c in channels]  # type: ignore[no-untyped-call]
    done = 0
    errors: list[str] = []

    async def loop(stub: object) -> None:
        nonlocal done
        while time.monotonic() < end:
            request = gateway_pb2.InvokeRequest(
                request_id=f"w-{port}-{next(_REQUEST_IDS)}",
                capability="text.echo",
                payload=PAYLOAD,
                deadline_unix_ms=int((time.time() + 10) * 1000),
            )
            try:
                await stub.Invoke(request, timeout=10.0)  # type: ignore[attr-defined]
                done += 1
            except aio.AioRpcError as err:
                errors.append(f"{err.code().name}: {err.details()}")
                return

    for channel in channels:  # connected (TLS handshakes done) before the clock starts
        await channel.channel_ready()
    clock = Clock(pids)
    end = time.monotonic() + args.seconds
    await asyncio.gather(*(loop(stubs[i % len(stubs)]) for i in range(CONCURRENCY)))
    measured = clock.round(done, 0)
    for channel in channels:
        await channel.close()
    if errors:
        raise SystemExit(f"call failed: {errors[0]}")
    return measured


BINDINGS = ("grpc", "https")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the report."""
    parser = argparse.ArgumentParser(description="workers = 1 vs workers = N, 32 in flight.")
    parser.add_argument("--workers", type=int, default=2, help="N (default 2)")
    parser.add_argument("--seconds", type=float, default=6.0, help="per round, binding and agent")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", type=int, default=8, help="gRPC client connections")
    parser.add_argument(
        "--bindings",
        default=",".join(BINDINGS),
        help="grpc (Invoke), https (A2A JSON-RPC SendMessage), or both (default: grpc,https)",
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin_workers = true for the N-worker agent (default; --no-pin to compare)",
    )
    args = parser.parse_args(argv)
    bindings = [b for b in BINDINGS if b in args.bindings.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        base = Path(tmp)
        pki = base / "pki"
        init_ca(pki, TRUST_DOMAIN)
        server, caller = issue(pki, "server"), issue(pki, "caller")
        policy = PolicyDocument.model_validate(
            {
                "grants": [
                    {
                        "peer": caller.spiffe_id,
                        "capabilities": ["text.echo"],
                        "max_payload_bytes": 65536,
                        "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
                    }
                ]
            }
        )
        (base / "policy.toml").write_text(render_policy(policy))
        tls = TlsMaterial.from_files(pki / "ca.pem", caller.cert_path, caller.key_path)
        agents = {
            n: start(write_agent(base, f"w{n}", n, server, pki / "ca.pem", pin=args.pin))
            for n in (1, args.workers)
        }
        rounds: dict[tuple[str, int], list[Round]] = {(b, n): [] for b in bindings for n in agents}
        try:
            for _ in range(args.rounds):
                for binding in bindings:
                    for n, agent in agents.items():
                        pids = serving_pids(agent.proc.pid)
                        run = (
                            drive(agent.port, pids, tls, server.spiffe_id, args)
                            if binding == "grpc"
                            else drive_https(agent.https_url, pids, tls, server.spiffe_id, args)
                        )
                        rounds[binding, n].append(asyncio.run(run))
        finally:
            for agent in agents.values():
                agent.proc.terminate()
                agent.proc.wait(timeout=60)
        audited = {
            n: len(
                query_records(
                    open_audit_reader(base / f"w{n}-audit.sqlite"), AuditFilter(limit=10_000_000)
                )
            )
            for n in agents
        }
    print(f"{CONCURRENCY} in flight, {os.cpu_count()} CPUs, medians of {args.rounds} rounds:")
    for binding in bindings:
        report(binding, {n: rounds[binding, n] for n in agents}, args)
    made = {
        n: sum(r.calls + r.untimed for (_, m), rs in rounds.items() if m == n for r in rs)
        for n in agents
    }
    print(f"audit records: {audited} (calls made: {made})")
    return 0 if audited == made else 1


def report(binding: str, rounds: dict[int, list[Round]], args: argparse.Namespace) -> None:
    """The table and ratio of one binding."""
    over = (
        f"over {args.channels} connections"
        if binding == "grpc"
        else f"over {CONCURRENCY} connections"
    )
    what = "Invoke" if binding == "grpc" else "A2A JSON-RPC SendMessage over HTTPS"
    print(f"\n{binding}: {what}, {over}")
    print("workers  calls/s  srv us/call  cli us/call  worker CPU shares (last round)   rounds")
    for n, runs in rounds.items():
        shares = " ".join(f"{share:.2f}" for share in runs[-1].worker_cpu_shares)
        print(
            f"{n:7d} {statistics.median(r.calls_per_s for r in runs):8.0f} "
            f"{statistics.median(r.server_us_per_call for r in runs):12.0f} "
            f"{statistics.median(r.client_us_per_call for r in runs):12.0f}  {shares:32s} "
            f"{[round(r.calls_per_s) for r in runs]}"
        )
    one, many = (statistics.median(r.calls_per_s for r in rounds[n]) for n in (1, args.workers))
    ratio = many / one
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    print(f"ratio {ratio:.2f}x (target >= {TARGET_RATIO}x: {verdict})")
    cpu_per_call = statistics.median(
        r.server_us_per_call + r.client_us_per_call for r in rounds[args.workers]
    )
    print(
        f"(info) workers = {args.workers}: server + client CPU {cpu_per_call:.0f} us/call, "
        f"so at most {(os.cpu_count() or 1) * 1e6 / cpu_per_call:.0f} calls/s "
        f"on {os.cpu_count()} idle CPUs"
    )


if __name__ == "__main__":
    sys.exit(main())
