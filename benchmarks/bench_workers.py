"""Workers benchmark: ``text.echo`` at 32 in flight against ``workers = 1`` vs ``workers = N``.

Run ``python benchmarks/bench_workers.py --help``. One run mints a PKI, writes
a policy granting ``caller`` ``text.echo`` and two agent configs that differ
only in ``workers``, and starts each agent as ``a2a-gateway serve`` (the real
supervisor and worker processes; full audit). This process is the client: it
opens ``--channels`` connections (the kernel spreads connections, not calls,
over the workers) and keeps 32 calls in flight across them for ``--seconds``,
alternating the two agents round by round; medians of rounds are reported
with the ratio calls/s(N workers) / calls/s(1 worker).

The exit status is 0 whatever the ratio (a measurement, not a test) and 1
when a call failed or an audit log does not hold one record per call.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from grpc import aio

from gateway.audit import query_records
from gateway.devtools.pki import IssuedIdentity, init_ca, issue
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


def write_agent(base: Path, name: str, workers: int, server: IssuedIdentity, ca: Path) -> Path:
    """An agent config (TOML) serving ``text.echo`` with ``workers`` processes."""
    state = base / f"{name}-state"
    text = "\n".join(
        [
            f"workers = {workers}",
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


async def drive(port: int, tls: TlsMaterial, server_id: str, args: argparse.Namespace) -> float:
    """Calls/s with 32 in flight over ``args.channels`` connections for ``args.seconds``."""
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
    end = time.monotonic() + args.seconds

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

    started = time.monotonic()
    await asyncio.gather(*(loop(stubs[i % len(stubs)]) for i in range(CONCURRENCY)))
    elapsed = time.monotonic() - started
    for channel in channels:
        await channel.close()
    if errors:
        raise SystemExit(f"call failed: {errors[0]}")
    return done / elapsed


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the report."""
    parser = argparse.ArgumentParser(description="workers = 1 vs workers = N, 32 in flight.")
    parser.add_argument("--workers", type=int, default=2, help="N (default 2)")
    parser.add_argument("--seconds", type=float, default=6.0, help="per round and agent")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", type=int, default=8, help="client connections")
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
            n: start(write_agent(base, f"w{n}", n, server, pki / "ca.pem"))
            for n in (1, args.workers)
        }
        rates: dict[int, list[float]] = {n: [] for n in agents}
        try:
            for _ in range(args.rounds):
                for n, (_, port) in agents.items():
                    rates[n].append(asyncio.run(drive(port, tls, server.spiffe_id, args)))
        finally:
            for proc, _ in agents.values():
                proc.terminate()
                proc.wait(timeout=60)
        audited = {
            n: len(query_records(base / f"w{n}-audit.sqlite", limit=10_000_000)) for n in agents
        }
    one, many = (statistics.median(rates[n]) for n in (1, args.workers))
    ratio = many / one
    print(f"calls/s at {CONCURRENCY} in flight over {args.channels} connections (medians):")
    for n, median in ((1, one), (args.workers, many)):
        print(f"  workers = {n}: {median:8.0f}   rounds {[round(r) for r in rates[n]]}")
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    print(f"ratio {ratio:.2f}x (target >= {TARGET_RATIO}x: {verdict})")
    print(f"audit records: {audited}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
