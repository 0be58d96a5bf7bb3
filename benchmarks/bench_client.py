"""PeerClient overhead: ``PeerClient.invoke`` against a raw stub call on the same channel.

Run ``python benchmarks/bench_client.py --help``. One run starts the servers of
``bench_invoke.py`` in a child process and calls the **raw** echo server (so the
server side costs the same for both and is as cheap as it gets) from this
process, over ONE ``PeerClient``'s channel:

- ``stub``: ``PeerGatewayStub.Invoke`` with a prebuilt-per-call ``InvokeRequest``
  (request id, deadline), as the bench client of ``bench_invoke.py`` sends it;
- ``client``: ``PeerClient.invoke`` with the same payload bytes (request id,
  deadline, tracing hooks, typed result).

Sequential and 32 in flight, rotated over rounds; ``client/stub`` is the ratio
of calls per second (target >= 0.90).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench_invoke import CONCURRENCY, ServerProcess, echo_payload, make_workspace

from gateway.client.peer_client import PeerClient
from gateway.wire.v1 import gateway_pb2

TARGET = 0.90


async def rate(call: Callable[[], Awaitable[Any]], concurrency: int, calls: int) -> float:
    """Calls per second of ``calls`` calls, ``concurrency`` in flight."""
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < calls:
            issued += 1
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return calls / (time.perf_counter() - started)


async def measure(client: PeerClient, payload: bytes, calls: int, rounds: int) -> dict[str, Any]:
    """Medians of rounds of stub vs client calls/s, per mode."""
    stub = client._stub  # the client's own channel: only the per-call work differs
    sent = 0

    async def raw() -> None:
        nonlocal sent
        sent += 1
        request = gateway_pb2.InvokeRequest(
            request_id=f"stub-{sent}",
            capability="text.echo",
            payload=payload,
            deadline_unix_ms=int((time.time() + 10.0) * 1000),
        )
        reply = await stub.Invoke(request, timeout=10.0)
        assert reply.payload == payload

    async def peer() -> None:
        result = await client.invoke("text.echo", payload, timeout=10.0)
        assert result.payload == payload

    report: dict[str, Any] = {}
    for concurrency in (1, CONCURRENCY):
        await rate(raw, concurrency, calls // 10)
        await rate(peer, concurrency, calls // 10)
        got: dict[str, list[float]] = {"stub": [], "client": []}
        for number in range(rounds):
            order = [("stub", raw), ("client", peer)]
            for name, call in order if number % 2 == 0 else order[::-1]:
                got[name].append(await rate(call, concurrency, calls))
        mode = "sequential" if concurrency == 1 else f"conc{concurrency}"
        stub_rate, client_rate = (statistics.median(got[k]) for k in ("stub", "client"))
        report[mode] = {
            "stub_calls_per_s": stub_rate,
            "client_calls_per_s": client_rate,
            "ratio": client_rate / stub_rate,
        }
    return report


async def client_run(ws: Any, ports: dict[str, int], payload: bytes, args: Any) -> dict[str, Any]:
    """One PeerClient to the raw server; measure, close."""
    client = PeerClient(ws.config.id, f"127.0.0.1:{ports['raw_port']}", ws.caller_tls)
    try:
        return await measure(client, payload, args.calls, args.rounds)
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    """Run once and print the table and RESULT."""
    parser = argparse.ArgumentParser(description="PeerClient.invoke vs a raw stub call.")
    parser.add_argument("--calls", type=int, default=2000, help="calls per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--payload-bytes", type=int, default=256)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        ws = make_workspace(Path(tmp), args.payload_bytes)
        server = ServerProcess(ws.config, None)
        try:
            ports = server.start()
            report = asyncio.run(client_run(ws, ports, echo_payload(args.payload_bytes), args))
        finally:
            server.stop()
    print(
        f"PeerClient benchmark: payload {args.payload_bytes} B, {args.calls} calls per phase, "
        f"{args.rounds} rounds, raw echo server\n"
    )
    print(f"{'mode':<11} {'stub calls/s':>12} {'client calls/s':>14} {'client/stub':>11}")
    for mode, row in report.items():
        print(
            f"{mode:<11} {row['stub_calls_per_s']:>12.1f} {row['client_calls_per_s']:>14.1f} "
            f"{row['ratio']:>11.3f}"
        )
    print("\nRESULT")
    for mode, row in report.items():
        verdict = "PASS" if row["ratio"] >= TARGET else "MISS"
        print(f"  client_vs_stub_{mode:<11} {row['ratio']:>6.3f}  (target >= {TARGET})  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
