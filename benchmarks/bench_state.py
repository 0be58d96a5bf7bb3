"""State benchmark: PostgreSQL vs SQLite for audit and shared state, one vs two replicas.

Run ``python benchmarks/bench_state.py --help``. One run, same machine, same moment:

1. starts a throwaway PostgreSQL cluster (initdb/pg_ctl, fsync ON, as the
   ``postgres`` user when run as root) and a dev PKI;
2. audit records/s: an :class:`~gateway.audit.AuditLog` in a SQLite file
   (``sync=full``) and in PostgreSQL, with (a) durable records, 64 callers
   waiting at once (refusals; every caller waits for its commit), and (b)
   fire-and-forget records then one flush (allowed calls);
3. Invoke calls/s against ``serve`` processes: alice with SQLite state, alice
   with audit and state in PostgreSQL, and two replicas of alice (same
   identity and database, own port) behind a round-robin loopback TCP
   balancer. The load is half ``text.echo`` (read) and half ``kv.put`` with
   an idempotency key (write: durable write-ahead record, claim, answer),
   from 8 channels with 32 calls in flight;
4. checks that every audit chain verifies and the record counts match.

The exit status is 0 whatever the numbers are (a measurement, not a test),
1 if a call failed or an audit chain does not verify.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.audit import AuditLog, AuditRecord, verify_chain
from gateway.audit.store.postgres import verify_agent_chains
from gateway.client.peer_client import PeerClient
from gateway.postgres.dsn import StoreLocation
from gateway.storage import connection_source, location, open_audit_reader, open_chain_writer
from tests.agent_process import AgentProcess, write_agent_toml
from tests.postgres import PostgresCluster, remove_cluster, start_cluster
from tests.support import Pki, grant, make_pki, spiffe, write_policy

ALICE = spiffe("alice")


def _record(n: int) -> AuditRecord:
    return AuditRecord(
        time_unix_ms=int(time.time() * 1000),
        request_id=f"r-{n}",
        peer_id=spiffe("bob"),
        capability="kv.put",
        version_constraint="^1",
        served_version="1.0.0",
        decision="refuse",
        reason="CAPABILITY_NOT_GRANTED",
        payload_size=16,
        payload_sha256="ab" * 32,
        latency_ms=0.5,
    )


async def audit_rates(where: StoreLocation, durable: int, plain: int) -> dict[str, float]:
    """Records/s of one store: durable (64 waiting callers) and fire-and-forget."""
    log = AuditLog(open_chain_writer(where, agent_id=ALICE))
    await log.start()
    counter = itertools.count()

    async def caller(count: int) -> None:
        for _ in range(count):
            await log.record_durable(_record(next(counter)))

    started = time.perf_counter()
    await asyncio.gather(*(caller(durable // 64) for _ in range(64)))
    durable_rate = (durable // 64 * 64) / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(plain):
        log.record(_record(next(counter)))
    await log.flush()
    plain_rate = plain / (time.perf_counter() - started)
    await log.close()
    report = verify_chain(open_audit_reader(where), ALICE)
    if not report.ok or report.records != durable // 64 * 64 + plain:
        raise SystemExit(f"audit chain of {where} does not verify: {report}")
    return {"durable_records_per_s": durable_rate, "plain_records_per_s": plain_rate}


class RoundRobin:
    """A loopback TCP balancer: each new connection goes to the next backend."""

    def __init__(self, backends: list[str]) -> None:
        self._next = itertools.cycle(backends)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Future[tuple[None, None]]] = set()
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        if self._pipes:  # each ends on the EOF of its closed sockets
            await asyncio.wait(self._pipes, timeout=10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = next(self._next).rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        both = asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._pipes.add(both)
        await both


async def invoke_rate(pki: Pki, address: str, calls: int) -> float:
    """Calls/s of half echo, half keyed kv.put: 8 channels, 32 in flight."""
    clients = [PeerClient(ALICE, address, pki.material("bob")) for _ in range(8)]
    run = uuid.uuid4().hex[:8]
    n = itertools.count()

    def call(client: PeerClient) -> Awaitable[object]:
        i = next(n)
        if i % 2:
            return client.invoke("text.echo", {"text": "x" * 64})
        return client.invoke(
            "kv.put", {"key": f"k{i % 50}", "value": "v"}, idempotency_key=f"{run}-{i}"
        )

    async def worker(client: PeerClient, count: int) -> None:
        for _ in range(count):
            await call(client)

    for client in clients:  # connect and warm up outside the timed part
        await client.invoke("text.echo", {"text": "warm"})
    started = time.perf_counter()
    await asyncio.gather(*(worker(clients[w % 8], calls // 32) for w in range(32)))
    elapsed = time.perf_counter() - started
    for client in clients:
        await client.close()
    return (calls // 32 * 32) / elapsed


def _alice(pki: Pki, base: Path, name: str, audit_db: Path | str, state_db: str | None) -> Path:
    policy = write_policy(base / "policy.toml", [grant("bob", ["text.echo", "kv.put"])])
    return write_agent_toml(
        base / f"{name}.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=audit_db,
        state_dir=base / f"{name}-state",
        state_db=state_db,
    )


async def serving(configs: list[Path], measure: Callable[[list[str]], Awaitable[float]]) -> float:
    agents = [AgentProcess(config) for config in configs]
    try:
        for agent in agents:
            agent.spawn()
        return await measure([agent.wait_serving() for agent in agents])
    finally:
        for agent in agents:
            agent.terminate()


async def main_async(args: argparse.Namespace) -> int:
    base = Path(tempfile.mkdtemp(prefix="bench-state-"))
    pki = make_pki(base)
    pki.ensure("alice")
    cluster: PostgresCluster | None = start_cluster(fsync=True)
    if cluster is None:
        print("PostgreSQL is not installed (apt-get install postgresql)", file=sys.stderr)
        return 1
    results: dict[str, object] = {}
    try:
        audit: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgres": []}
        for round_ in range(args.rounds):
            audit["sqlite"].append(
                await audit_rates(base / f"audit-{round_}.sqlite", args.durable, args.plain)
            )
            dsn = location(cluster.fresh_database())
            audit["postgres"].append(await audit_rates(dsn, args.durable, args.plain))
        results["audit"] = {
            store: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            for store, rounds in audit.items()
        }

        async def one(addresses: list[str]) -> float:
            return await invoke_rate(pki, addresses[0], args.calls)

        async def balanced(addresses: list[str]) -> float:
            balancer = RoundRobin(addresses)
            await balancer.start()
            try:
                return await invoke_rate(pki, balancer.address, args.calls)
            finally:
                await balancer.close()

        invoke: dict[str, list[float]] = {"sqlite": [], "postgres": [], "postgres_2_replicas": []}
        for round_ in range(args.rounds):
            run = base / f"run-{round_}"
            run.mkdir()
            sqlite = _alice(pki, run, "sqlite", run / "alice-audit.sqlite", None)
            invoke["sqlite"].append(await serving([sqlite], one))
            dsn_one = cluster.fresh_database()
            pg = _alice(pki, run, "pg", dsn_one, dsn_one)
            invoke["postgres"].append(await serving([pg], one))
            dsn_two = cluster.fresh_database()
            replicas = [_alice(pki, run, f"pg{n}", dsn_two, dsn_two) for n in (1, 2)]
            invoke["postgres_2_replicas"].append(await serving(replicas, balanced))
            for served in (dsn_one, dsn_two):
                reports = verify_agent_chains(connection_source(location(served)))
                if not all(r.ok for r in reports.values()):
                    print(f"audit chain broken in {served}: {reports}", file=sys.stderr)
                    return 1
        medians = {name: statistics.median(rates) for name, rates in invoke.items()}
        results["invoke_calls_per_s"] = medians
        results["ratios"] = {
            "postgres_vs_sqlite": medians["postgres"] / medians["sqlite"],
            "two_replicas_vs_one_postgres": medians["postgres_2_replicas"] / medians["postgres"],
        }
    finally:
        remove_cluster(cluster)
    print(json.dumps(results, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="medians of this many rounds")
    parser.add_argument("--durable", type=int, default=3200, help="durable audit records/round")
    parser.add_argument("--plain", type=int, default=20000, help="plain audit records/round")
    parser.add_argument("--calls", type=int, default=3200, help="Invoke calls per variant/round")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
