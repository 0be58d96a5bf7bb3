"""Requests per second of ``GET /metrics`` and of a console page, this tree against another.

    python benchmarks/bench_http_endpoints.py --other /tmp/before   # a checkout of main, say
    python benchmarks/bench_http_endpoints.py                       # this tree alone

Each tree runs in a child process of its own (``--serve``): a real agent
(session CA, SQLite audit log) with ``[console]`` and ``[metrics]`` on
127.0.0.1, both children up at once. This process is the client: for each
endpoint, ``--clients`` loops each send one GET per new connection (both
listeners close after one answer) and read it to the end, for ``--seconds``;
every answer must be 200. The trees take turns leading across ``--rounds``;
the table shows each tree's median of rounds and the ratio this / other:
requests per second as the client sees them, and the server process's CPU
time per request (user + system, all threads; steadier on a loaded machine).
Bounded: rounds x trees x endpoints x seconds, plus a few seconds of start-up.

``--instructions N`` counts instead (valgrind's callgrind, repeatable on a
loaded machine): each child runs under callgrind with instrumentation off; per
endpoint, after a warm-up, it is on for N sequential requests, and
the server's instructions per request (every thread) are printed. Slow: the
agents start in about a minute under valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
ENDPOINTS = (("metrics", "/metrics"), ("console", "/grants"))


async def _serve() -> None:
    sys.path.insert(0, os.getcwd())
    import gateway
    from gateway.config import ConsoleSettings, MetricsSettings
    from tests.support import agent_config, grant, make_pki, started, write_policy

    with tempfile.TemporaryDirectory(prefix="bench-http-") as folder:
        base = Path(folder)
        pki = make_pki(base)
        policy = write_policy(base / "alice-policy.toml", [grant("bob", ["text.echo"])])
        config = agent_config(pki, base, "alice", policy).model_copy(
            update={
                "console": ConsoleSettings(listen="127.0.0.1:0"),
                "metrics": MetricsSettings(listen="127.0.0.1:0"),
            }
        )
        agent = await started(config)
        try:
            assert agent.console is not None
            addresses = {"console": agent.console.address, "code": gateway.__file__}
            addresses["metrics"] = agent.telemetry.metrics_address or ""
            print(json.dumps(addresses), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        finally:
            await agent.stop()


async def _one(host: str, port: int, request: bytes) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    answer = await reader.read()
    writer.close()
    if not answer.startswith(b"HTTP/1.1 200 "):
        raise AssertionError(answer[:80])


async def _rate(address: str, path: str, clients: int, seconds: float) -> float:
    host, port = address.rsplit(":", 1)
    request = f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode()
    done = 0
    end = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < end:
            await _one(host, int(port), request)
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return done / (time.monotonic() - start)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child(
    tree: Path, under: list[str] | None = None
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    child = subprocess.Popen(
        [*(under or []), sys.executable, str(Path(__file__).resolve()), "--serve"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    return child, json.loads(child.stdout.readline())


async def _compare(trees: dict[str, Path], args: argparse.Namespace) -> None:
    children = {name: _child(tree) for name, tree in trees.items()}
    rates: dict[tuple[str, str], list[float]] = {}
    costs: dict[tuple[str, str], list[float]] = {}
    try:
        order = list(trees)
        for round_ in range(args.rounds):
            for name in order[round_ % len(order) :] + order[: round_ % len(order)]:
                for endpoint, path in ENDPOINTS:
                    child, facts = children[name]
                    cpu = _cpu_seconds(child.pid)
                    rate = await _rate(facts[endpoint], path, args.clients, args.seconds)
                    cpu = _cpu_seconds(child.pid) - cpu
                    rates.setdefault((name, endpoint), []).append(rate)
                    costs.setdefault((name, endpoint), []).append(cpu / (rate * args.seconds))
    finally:
        for child, _ in children.values():
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
    for name, (_, facts) in children.items():
        print(f"{name}: {Path(facts['code']).parent.parent}")
    for table, unit, scale in ((rates, "r/s", 1.0), (costs, "srv us/req", 1e6)):
        print(f"{'GET':<18}" + "".join(f"{name + ' ' + unit:>18}" for name in trees), end="")
        print("   this/other" if len(trees) == 2 else "")
        for endpoint, path in ENDPOINTS:
            medians = [statistics.median(table[(name, endpoint)]) * scale for name in trees]
            ratio = f"{medians[0] / medians[1]:13.2f}" if len(medians) == 2 else ""
            print(f"{endpoint + ' ' + path:<18}" + "".join(f"{m:>18.0f}" for m in medians) + ratio)


async def _instructions(trees: dict[str, Path], args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-http-callgrind-"))
    under = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--dump-instr=no",
        "--collect-jumps=no",
        f"--log-file={folder / 'valgrind.%p.log'}",
        f"--callgrind-out-file={folder / 'callgrind.%p.out'}",
    ]
    per_request: dict[tuple[str, str], float] = {}
    for name, tree in trees.items():
        child, facts = _child(tree, under)
        try:
            for endpoint, path in ENDPOINTS:
                host, port = facts[endpoint].rsplit(":", 1)
                request = f"GET {path} HTTP/1.1\r\nHost: {facts[endpoint]}\r\n\r\n".encode()
                for _ in range(20):  # warm-up
                    await _one(host, int(port), request)
                _callgrind_control("-z", child.pid)
                _callgrind_control("-i", "on", child.pid)
                for _ in range(args.instructions):
                    await _one(host, int(port), request)
                _callgrind_control("-i", "off", child.pid)
                _callgrind_control("-d", child.pid)
                dumps = sorted(folder.glob(f"callgrind.{child.pid}.out.*"), key=os.path.getmtime)  # noqa: ASYNC240
                per_request[(name, endpoint)] = _total(dumps[-1]) / args.instructions
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=120)
    print(f"{'GET':<18}" + "".join(f"{name + ' Ir/req':>18}" for name in trees), end="")
    print("   this/other" if len(trees) == 2 else "")
    for endpoint, path in ENDPOINTS:
        counts = [per_request[(name, endpoint)] for name in trees]
        ratio = f"{counts[0] / counts[1]:13.3f}" if len(counts) == 2 else ""
        print(f"{endpoint + ' ' + path:<18}" + "".join(f"{c:>18,.0f}" for c in counts) + ratio)
    shutil.rmtree(folder)


def _callgrind_control(*words: object) -> None:
    subprocess.run(
        ["callgrind_control", *map(str, words)], check=True, capture_output=True, timeout=120
    )


def _total(dump: Path) -> int:
    for line in reversed(dump.read_text().splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise ValueError(f"{dump}: no totals")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=Path, help="another source tree to compare against")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instructions", type=int, metavar="N", help="count (callgrind)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    trees = {"this": HERE} | ({"other": args.other.resolve()} if args.other else {})
    asyncio.run((_instructions if args.instructions else _compare)(trees, args))


if __name__ == "__main__":
    main()
