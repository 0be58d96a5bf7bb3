#!/usr/bin/env python3
"""Load test: 64 concurrent callers over three agents, allowed and refused calls mixed.

Bounded in time (--seconds) and count (--max-calls); loopback only. Agents run
in child processes (so their memory is measured on its own) with the demo's
PKI and policies. At the end every agent's audit log must hold exactly one
record per call made to it, and its hash chain must verify.

    python scripts/load.py --seconds 120
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.audit import query_records, verify_chain
from gateway.client.peer_client import PeerClient
from gateway.config import AgentConfig
from gateway.devtools.demo import AGENTS, write_demo_files
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial

# (caller, target, capability, payload maker, expected reason, weight)
Mix = tuple[str, str, str, Any, str, int]
MIX: list[Mix] = [
    ("bob", "alice", "text.echo", lambda: {"text": "hello"}, "OK", 20),
    ("bob", "alice", "text.search", lambda: {"query": "audit chain", "limit": 2}, "OK", 15),
    ("bob", "alice", "kv.put", lambda: {"key": uuid.uuid4().hex, "value": "v"}, "OK", 10),
    ("alice", "bob", "text.echo", lambda: {"text": "hi"}, "OK", 10),
    ("alice", "carol", "kv.put", lambda: {"key": uuid.uuid4().hex, "value": "v"}, "OK", 10),
    ("carol", "alice", "text.search", lambda: {"query": "spiffe"}, "OK", 5),
    ("bob", "alice", "kv.get", lambda: {"key": "k"}, "CAPABILITY_NOT_GRANTED", 6),
    ("carol", "alice", "kv.put", lambda: {"key": "k", "value": "v"}, "RISK_NOT_GRANTED", 6),
    ("mallory", "alice", "text.echo", lambda: {"text": "x"}, "UNKNOWN_PEER", 6),
    ("bob", "alice", "text.echo", lambda: {"text": "x" * 600}, "PAYLOAD_TOO_LARGE", 4),
    ("bob", "alice", "text.search", lambda: {"query": "x", "admin": 1}, "INVALID_INPUT", 4),
    ("bob", "carol", "kv.get", lambda: {"key": "k"}, "UNKNOWN_PEER", 4),
]


def _serve(config: AgentConfig, ready: Any, stop: Any) -> None:
    async def main() -> None:
        agent = Agent(config)
        await agent.start(watch_policy=False)
        ready.put(agent.port)
        await asyncio.to_thread(stop.wait)
        await agent.stop(grace=5.0)

    asyncio.run(main())


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"OK": [], "refused": []})
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    calls_to: Counter[str] = field(default_factory=Counter)


async def caller(
    clients: dict[tuple[str, str], PeerClient],
    tally: Tally,
    deadline: float,
    budget: list[int],
    rng: random.Random,
) -> None:
    weights = [entry[5] for entry in MIX]
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        who, target, capability, make, expected, _ = rng.choices(MIX, weights)[0]
        started = time.perf_counter()
        try:
            await clients[(who, target)].invoke(capability, make(), timeout=10.0)
            reason = "OK"
        except GatewayError as err:
            reason = err.reason
        elapsed = (time.perf_counter() - started) * 1000
        tally.latencies["OK" if reason == "OK" else "refused"].append(elapsed)
        tally.outcomes[reason] += 1
        tally.calls_to[target] += 1
        if reason != expected:
            tally.unexpected[f"{who}->{target} {capability}: {reason} (expected {expected})"] += 1


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(
    configs: dict[str, AgentConfig], ports: dict[str, int], base: Path, args: argparse.Namespace
) -> Tally:
    pki = base / "pki"
    clients: dict[tuple[str, str], PeerClient] = {}
    for who, target, *_ in MIX:
        if (who, target) not in clients:
            tls = TlsMaterial.from_files(pki / "ca.pem", pki / f"{who}.pem", pki / f"{who}.key")
            clients[(who, target)] = PeerClient(
                configs[target].id, f"127.0.0.1:{ports[target]}", tls
            )
    tally = Tally()
    deadline = time.monotonic() + args.seconds
    budget = [args.max_calls]
    rng = random.Random(args.seed)
    await asyncio.gather(
        *[
            caller(clients, tally, deadline, budget, random.Random(rng.random()))
            for _ in range(args.concurrency)
        ]
    )
    for client in clients.values():
        await client.close()
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--max-calls", type=int, default=2_000_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="a2a-load-") as tmp:
        base = Path(tmp)
        configs = write_demo_files(base)
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        procs, ports = {}, {}
        for name in AGENTS:
            ready = ctx.Queue()
            proc = ctx.Process(target=_serve, args=(configs[name], ready, stop), daemon=True)
            proc.start()
            ports[name] = ready.get(timeout=60)
            procs[name] = proc
        rss_start = {name: rss_kib(proc.pid) for name, proc in procs.items()}
        started = time.monotonic()
        tally = asyncio.run(drive(configs, ports, base, args))
        elapsed = time.monotonic() - started
        rss_end = {name: rss_kib(proc.pid) for name, proc in procs.items()}
        stop.set()
        for proc in procs.values():
            proc.join(timeout=30)
        audit = {}
        for name in AGENTS:
            records = query_records(open_audit_reader(configs[name].audit_db))
            # Writes also have a write-ahead ADMITTED record: count calls, not rows.
            outcomes = [r for r in records if r.reason != "ADMITTED"]
            report = verify_chain(open_audit_reader(configs[name].audit_db))
            audit[name] = {
                "records": len(outcomes),
                "calls": tally.calls_to[name],
                "chain_ok": report.ok,
            }
    total = sum(tally.outcomes.values())
    summary = {
        "seconds": round(elapsed, 1),
        "calls": total,
        "calls_per_second": round(total / elapsed, 1),
        "concurrency": args.concurrency,
        "outcomes": dict(tally.outcomes.most_common()),
        "unexpected": dict(tally.unexpected),
        "latency_ms": {
            kind: {
                "p50": round(pct(v, 0.50), 2),
                "p99": round(pct(v, 0.99), 2),
                "mean": round(statistics.fmean(v), 2) if v else 0.0,
            }
            for kind, v in tally.latencies.items()
        },
        "rss_kib": {name: {"start": rss_start[name], "end": rss_end[name]} for name in AGENTS},
        "audit": audit,
    }
    ok = not tally.unexpected and all(
        a["records"] == a["calls"] and a["chain_ok"] for a in audit.values()
    )
    summary["result"] = "PASS" if ok else "FAIL"
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0 if ok else 1


def _print(s: dict[str, Any]) -> None:
    print(
        f"load: {s['calls']} calls in {s['seconds']} s = {s['calls_per_second']} calls/s "
        f"at {s['concurrency']} in flight"
    )
    for reason, count in s["outcomes"].items():
        print(f"  {reason:<24} {count}")
    for kind, lat in s["latency_ms"].items():
        print(f"  latency {kind:<8} p50 {lat['p50']} ms  p99 {lat['p99']} ms")
    for name, rss in s["rss_kib"].items():
        audit = s["audit"][name]
        print(
            f"  {name:<6} RSS {rss['start'] / 1024:.1f} -> {rss['end'] / 1024:.1f} MiB; audit "
            f"records {audit['records']} / calls {audit['calls']}; chain "
            f"{'ok' if audit['chain_ok'] else 'BROKEN'}"
        )
    print(f"  unexpected outcomes: {sum(s['unexpected'].values())}")
    for what, count in s["unexpected"].items():
        print(f"    {count} x {what}")
    print(f"RESULT {s['result']}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
