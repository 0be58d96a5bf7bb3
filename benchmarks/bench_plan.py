"""Plan benchmark: 64 independent remote steps over 4 peers, against the ideal.

Run ``python benchmarks/bench_plan.py --help``. One run:

1. mints a PKI; starts four peers (each serving ``bench.work``, a read
   capability that sleeps ``--work-ms``: a stand-in for I/O-bound work) and a
   runner whose outbound rules allow ``bench.work`` to all four;
2. measures the single-step time: a one-step plan through the same executor,
   median of ``--single-runs`` runs (routing, mTLS call, validation, checkpoint);
3. runs a plan of ``--steps`` independent steps, spread evenly over the peers
   (each step avoids the other three), with ``max_parallel``;
4. prints wall time against (steps / max_parallel) x single-step time.

Everything runs in one process and one event loop on loopback. Exit status is 0
whatever the ratio is (a measurement, not a test), 1 if the plan failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import Field

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, CapabilityRegistry, capability
from gateway.config import AgentConfig
from gateway.devtools.pki import init_ca, issue
from gateway.plans.document.model import Plan
from gateway.runtime.agent import Agent
from policies.grants import PolicyDocument
from policies.policy_file import render_policy

DOMAIN = "bench.a2agw"
PEERS = ("p1", "p2", "p3", "p4")


class WorkInput(ContractModel):
    n: int = Field(ge=0)


class WorkOutput(ContractModel):
    n: int


def work_capability(seconds: float) -> Capability:
    @capability("bench.work", "1.0.0", risk="read", timeout=10.0, idempotent=True)
    async def work(inp: WorkInput, ctx: CallContext) -> WorkOutput:
        """Sleep, then echo n."""
        await asyncio.sleep(seconds)
        return WorkOutput(n=inp.n)

    return work


def _id(name: str) -> str:
    return f"spiffe://{DOMAIN}/agent/{name}"


def _config(base: Path, name: str, policy: dict[str, Any], peers: list[Agent]) -> AgentConfig:
    path = base / f"{name}-policy.toml"
    path.write_text(render_policy(PolicyDocument.model_validate(policy)))
    pki = base / "pki"
    return AgentConfig.model_validate(
        {
            "id": _id(name),
            "tls": {"ca": pki / "ca.pem", "cert": pki / f"{name}.pem", "key": pki / f"{name}.key"},
            "policy": path,
            "audit_db": base / f"{name}-audit.sqlite",
            "state_dir": base / f"{name}-state",
            "modules": [],
            "peers": [{"id": p.config.id, "address": p.address} for p in peers],
        }
    )


async def start_agents(base: Path, work_seconds: float) -> tuple[Agent, list[Agent]]:
    init_ca(base / "pki", DOMAIN)
    for name in ("runner", *PEERS):
        issue(base / "pki", name)
    expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    peers = []
    for name in PEERS:
        grants = [
            {
                "peer": _id("runner"),
                "capabilities": ["bench.work"],
                "max_payload_bytes": 4096,
                "expires_at": expires,
            }
        ]
        registry = CapabilityRegistry()
        registry.register(work_capability(work_seconds))
        agent = Agent(_config(base, name, {"grants": grants}, []), registry)
        await agent.start(watch_policy=False)
        peers.append(agent)
    outbound = [{"peer": _id(name), "capabilities": ["bench.work"]} for name in PEERS]
    runner = Agent(_config(base, "runner", {"outbound": outbound}, peers), CapabilityRegistry())
    await runner.start(watch_policy=False)
    return runner, peers


def make_plan(steps: int, max_parallel: int) -> Plan:
    ids = [_id(name) for name in PEERS]
    return Plan.model_validate(
        {
            "goal": "benchmark",
            "max_parallel": max_parallel,
            "budget": {"max_elapsed_seconds": 600},
            "steps": [
                {
                    "id": f"s{i}",
                    "capability": "bench.work",
                    "input": {"n": i},
                    "avoid": ["local", *(p for p in ids if p != ids[i % len(ids)])],
                }
                for i in range(steps)
            ],
        }
    )


async def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="a2a-bench-plan-") as tmp:
        runner, peers = await start_agents(Path(tmp), args.work_ms / 1000.0)
        try:
            await runner.run(make_plan(len(PEERS), len(PEERS)))  # warm channels and discovery
            singles = []
            for _ in range(args.single_runs):
                started = time.perf_counter()
                single = await runner.run(make_plan(1, 1))
                singles.append(time.perf_counter() - started)
                if not single.ok:
                    print(f"single-step plan failed: {single.reason}", file=sys.stderr)
                    return 1
            started = time.perf_counter()
            result = await runner.run(make_plan(args.steps, args.max_parallel))
            wall = time.perf_counter() - started
        finally:
            for agent in (runner, *peers):
                await agent.stop(grace=0)
    if not result.ok:
        print(f"plan failed: {result.reason}: {result.message}", file=sys.stderr)
        return 1
    single_time = statistics.median(singles)
    ideal = args.steps / args.max_parallel * single_time
    where = sorted({s.where.rsplit("/", 1)[-1] for s in result.steps.values()})
    print(
        f"steps {args.steps} over {len(where)} peers ({', '.join(where)}), "
        f"max_parallel {args.max_parallel}, work {args.work_ms:g} ms"
    )
    print(f"single-step time (median of {args.single_runs}): {single_time * 1000:.1f} ms")
    print(f"ideal (steps / max_parallel) x single:        {ideal * 1000:.1f} ms")
    print(f"wall time:                                    {wall * 1000:.1f} ms")
    print(f"ratio wall / ideal: {wall / ideal:.2f} (target <= 1.25)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--max-parallel", type=int, default=8)
    parser.add_argument("--work-ms", type=float, default=50.0, help="capability sleep (ms)")
    parser.add_argument("--single-runs", type=int, default=7)
    return asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
