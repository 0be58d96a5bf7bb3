"""Limits benchmark: admitting and ending one call, in memory vs in the workers' table.

Run ``python benchmarks/bench_limits.py [--calls N] [--rounds R]``. Times
``acquire(peer, grant).release()`` in a loop (best of the rounds, µs per call)
for ``PeerCallLimits`` (one process) and ``LimitTable`` (``state_dir/limits.table``
for two workers, in a temporary folder), with a grant without limits (the
server-wide cap is still counted: every call takes this path) and one with a
rate, a burst and ``max_in_flight``. With ``--contend`` a second process
hammers the same table at the same time, so the lock is fought over.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.inbound.limits.admission import AdmissionControl, PeerCallLimits
from gateway.inbound.limits.shared_table import LimitTable, create_limit_file
from policies.grants import PeerGrant

PEER = "spiffe://bench.example/caller"


def grants() -> dict[str, PeerGrant]:
    """The two grants measured, by name."""
    base = {
        "peer": PEER,
        "capabilities": ["text.echo"],
        "max_payload_bytes": 4096,
        "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
    }
    limited = {**base, "max_calls_per_second": 1e6, "burst": 1_000_000, "max_in_flight": 100}
    return {
        "no limits": PeerGrant.model_validate(base),
        "rate+burst+in_flight": PeerGrant.model_validate(limited),
    }


def per_call_us(limits: AdmissionControl, grant: PeerGrant, calls: int, rounds: int) -> float:
    """Best of ``rounds`` runs of ``calls`` admit+end, in µs per call."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            limits.acquire(PEER, grant).release()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def hammer(path: str, seconds: float) -> None:
    """Worker 1: admit and end calls of the same peer for ``seconds``."""
    table = LimitTable(Path(path), 1, 2, 1_000_000)
    grant = grants()["rate+burst+in_flight"]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        table.acquire(PEER, grant).release()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--contend", action="store_true", help="a second process on the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        path = Path(tmp) / "limits.table"
        create_limit_file(path, 2)
        table = LimitTable(path, 0, 2, 1_000_000)
        rival = None
        if args.contend:
            rival = multiprocessing.Process(target=hammer, args=(str(path), 600.0), daemon=True)
            rival.start()
        try:
            print("acquire+release, µs per call (best of rounds)")
            for name, grant in grants().items():
                memory = per_call_us(PeerCallLimits(1_000_000), grant, args.calls, args.rounds)
                shared = per_call_us(table, grant, args.calls, args.rounds)
                print(f"{name:22s} PeerCallLimits {memory:6.2f}   LimitTable {shared:6.2f}")
        finally:
            if rival is not None:
                rival.terminate()
                rival.join()
            table.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
