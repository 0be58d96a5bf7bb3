"""Workers benchmark: ``text.echo`` at 32 in flight against ``workers = 1`` vs ``workers = N``.

Run ``python benchmarks/bench_workers.py --help``. One run mints a PKI, writes
a policy granting ``caller`` ``text.echo`` and two agent configs that differ
only in ``workers`` (the N-worker one with ``pin_workers = true`` unless
``--no-pin``), and starts each agent as ``a2a-gateway serve`` (the real
supervisor and worker processes; full audit). This process is the client: it
opens ``--channels`` connections (the kernel spreads connections, not calls,
over the workers) and keeps 32 calls in flight across them for ``--seconds``,
alternating the two agents round by round; medians of rounds are reported
with the ratio calls/s(N workers) / calls/s(1 worker), the CPU per call of
the serving processes (supervisor and workers, from /proc) and of the client,
each worker's share of the server CPU (how evenly the kernel spread the
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

from grpc import aio

from gateway.audit import query_records
from gateway.audit.filter import AuditFilter
from gateway.devtools.pki import IssuedIdentity, init_ca, issue
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial, channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from policies.grants import PolicyDocument
from policies.policy_file import render_policy

TRUST_DOMAIN = "bench.example"
CONCURRENCY = 32
PAYLOAD = json.dumps({"text": "x" * 245}, separators=(",", ":")).encode()  # 256 bytes
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
            "",
        ]
    )
    path = base / f"{name}.toml"
    path.write_text(text)
    return path


def start(config: Path) -> tuple[subprocess.Popen[str], int]:
    """``serve --config``; returns the process and its port once it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if " serving on " in line:
            return proc, int(line.rsplit(":", 1)[1])
    proc.kill()
    raise SystemExit(f"{config.name}: did not start serving")


@dataclass(frozen=True)
class Round:
    """One agent's share of one round."""

    calls: int
    calls_per_s: float
    server_us_per_call: float
    """CPU of the supervisor and all workers (every thread) per call."""
    client_us_per_call: float
    worker_cpu_shares: list[float]
    """Each serving process's part of the server CPU (one entry with ``workers = 1``)."""


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
    served_before = [cpu_seconds(pid) for pid in pids]
    client_before = time.process_time()
    started = time.monotonic()
    end = started + args.seconds
    await asyncio.gather(*(loop(stubs[i % len(stubs)]) for i in range(CONCURRENCY)))
    elapsed = time.monotonic() - started
    client_cpu = time.process_time() - client_before
    served = [cpu_seconds(pid) - before for pid, before in zip(pids, served_before, strict=True)]
    for channel in channels:
        await channel.close()
    if errors:
        raise SystemExit(f"call failed: {errors[0]}")
    total = sum(served) or 1e-9
    return Round(
        calls=done,
        calls_per_s=done / elapsed,
        server_us_per_call=total / done * 1e6,
        client_us_per_call=client_cpu / done * 1e6,
        worker_cpu_shares=[part / total for part in served[1:] or served],
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the report."""
    parser = argparse.ArgumentParser(description="workers = 1 vs workers = N, 32 in flight.")
    parser.add_argument("--workers", type=int, default=2, help="N (default 2)")
    parser.add_argument("--seconds", type=float, default=6.0, help="per round and agent")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", type=int, default=8, help="client connections")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin_workers = true for the N-worker agent (default; --no-pin to compare)",
    )
    args = parser.parse_args(argv)
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
        rounds: dict[int, list[Round]] = {n: [] for n in agents}
        try:
            for _ in range(args.rounds):
                for n, (proc, port) in agents.items():
                    pids = serving_pids(proc.pid)
                    rounds[n].append(asyncio.run(drive(port, pids, tls, server.spiffe_id, args)))
        finally:
            for proc, _ in agents.values():
                proc.terminate()
                proc.wait(timeout=60)
        audited = {
            n: len(
                query_records(
                    open_audit_reader(base / f"w{n}-audit.sqlite"), AuditFilter(limit=10_000_000)
                )
            )
            for n in agents
        }
    one, many = (statistics.median(r.calls_per_s for r in rounds[n]) for n in (1, args.workers))
    ratio = many / one
    print(
        f"{CONCURRENCY} in flight over {args.channels} connections, "
        f"{os.cpu_count()} CPUs, medians of {args.rounds} rounds:"
    )
    print("workers  calls/s  srv us/call  cli us/call  worker CPU shares (last round)   rounds")
    for n in (1, args.workers):
        runs = rounds[n]
        shares = " ".join(f"{share:.2f}" for share in runs[-1].worker_cpu_shares)
        print(
            f"{n:7d} {statistics.median(r.calls_per_s for r in runs):8.0f} "
            f"{statistics.median(r.server_us_per_call for r in runs):12.0f} "
            f"{statistics.median(r.client_us_per_call for r in runs):12.0f}  {shares:32s} "
            f"{[round(r.calls_per_s) for r in runs]}"
        )
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
    made = {n: sum(r.calls for r in rounds[n]) for n in rounds}
    print(f"audit records: {audited} (calls made: {made})")
    return 0 if audited == made else 1


if __name__ == "__main__":
    sys.exit(main())
