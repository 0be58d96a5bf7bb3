"""Audit log throughput: records queued per second and durable records per second.

Run ``python benchmarks/bench_audit.py --help``. One run, in a temporary folder,
with ``sync = "full"`` (an fsync per commit), like an agent's default log:

1. ``queued``: ``--queued`` records handed to :meth:`AuditLog.record` (what an
   allowed call does), then one :meth:`AuditLog.flush`; records/s over the
   whole time, committing included (target >= 20000);
2. ``durable``: 64 concurrent callers each awaiting
   :meth:`AuditLog.record_durable` (what a refused call does) until
   ``--durable`` records are committed; records/s (target >= 10000);
3. the chain is verified (``verify_chain``): exit status 1 if it does not.

Also printed: the median time of one ``os.fsync`` of a small file in the same
folder, so that the durable rate can be read against the disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.audit import AuditLog, AuditRecord, verify_chain
from gateway.storage import open_audit_reader, open_chain_writer

WAITERS = 64
TARGETS = {"queued_records_per_s": 20000.0, "durable_records_per_s": 10000.0}


def fsync_ms(folder: Path, rounds: int = 50) -> float:
    """Median milliseconds of one small write + ``os.fsync`` of a file in ``folder``."""
    path = folder / "fsync-probe"
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for number in range(rounds):
            os.pwrite(fd, b"x" * 128, (number % 8) * 4096)
            started = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - started) * 1000.0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def make_record(number: int, decision: str) -> AuditRecord:
    """A record of realistic size (ids, a digest, a reason code)."""
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"bench-{number:08d}-0123456789abcdef",
        peer_id="spiffe://bench.example/agent/caller",
        capability="text.echo",
        version_constraint="",
        served_version="1.0.0" if decision == "allow" else "",
        decision=decision,  # type: ignore[arg-type]
        reason="OK" if decision == "allow" else "CAPABILITY_NOT_GRANTED",
        payload_size=256,
        payload_sha256="ab" * 32,
        latency_ms=0.123,
    )


async def queued(log: AuditLog, count: int) -> float:
    """Records/s of ``count`` fire-and-forget records plus the flush that commits them."""
    started = time.perf_counter()
    for number in range(count):
        log.record(make_record(number, "allow"))
    await log.flush()
    return count / (time.perf_counter() - started)


async def durable(log: AuditLog, count: int) -> float:
    """Records/s of ``count`` durable records, ``WAITERS`` callers awaiting at once."""
    issued = 0

    async def caller() -> None:
        nonlocal issued
        while issued < count:
            issued += 1
            await log.record_durable(make_record(issued, "refuse"))

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(WAITERS)))
    return count / (time.perf_counter() - started)


async def run(queued_count: int, durable_count: int, rounds: int) -> dict[str, Any]:
    """Rounds of both phases on one log; medians, fsync time and the chain check."""
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        base = Path(tmp)
        log = AuditLog(open_chain_writer(base / "audit.sqlite", sync="full"))
        await log.start()
        rates: dict[str, list[float]] = {name: [] for name in TARGETS}
        try:
            for _ in range(rounds):
                rates["queued_records_per_s"].append(await queued(log, queued_count))
                rates["durable_records_per_s"].append(await durable(log, durable_count))
            batches = log.batches_committed
        finally:
            await log.close()
        report = verify_chain(open_audit_reader(base / "audit.sqlite"))
        fsync = fsync_ms(base)
    result = {
        name: {
            "value": statistics.median(values),
            "target": TARGETS[name],
            "verdict": "PASS" if statistics.median(values) >= TARGETS[name] else "MISS",
        }
        for name, values in rates.items()
    }
    return {
        "settings": {"queued": queued_count, "durable": durable_count, "rounds": rounds},
        "fsync_ms": fsync,
        "batches": batches,
        "result": result,
        "chain": {"records": report.records, "ok": report.ok},
        "ok": report.ok and report.records == rounds * (queued_count + durable_count),
    }


def format_text(report: dict[str, Any]) -> str:
    """The RESULT block."""
    s = report["settings"]
    lines = [
        f"Audit benchmark: sync full, {s['queued']} queued + {s['durable']} durable records "
        f"({WAITERS} waiters) per round, {s['rounds']} rounds, {os.cpu_count()} CPUs",
        f"fsync of the audit folder's disk: {report['fsync_ms']:.3f} ms (median)",
        f"commits: {report['batches']}",
        "",
        "RESULT",
    ]
    for name, row in report["result"].items():
        lines.append(
            f"  {name:<24} {row['value']:>9.0f}  (target >= {row['target']:.0f})  {row['verdict']}"
        )
    c = report["chain"]
    lines.append(f"  chain: {c['records']} records, {'VERIFIED' if c['ok'] else 'BROKEN'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run once and print; 0 unless the chain does not verify."""
    parser = argparse.ArgumentParser(description="Audit log records/s, queued and durable.")
    parser.add_argument("--queued", type=int, default=20000, help="queued records per round")
    parser.add_argument("--durable", type=int, default=10000, help="durable records per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if min(args.queued, args.durable, args.rounds) < 1:
        parser.error("--queued, --durable and --rounds must be >= 1")
    report = asyncio.run(run(args.queued, args.durable, args.rounds))
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
