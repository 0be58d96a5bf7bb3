"""The A2A measurements beside ``bench_a2a.py``: time to first streamed event, and a fronted agent.

Run ``python benchmarks/bench_a2a_paths.py --help``. One run mints a PKI and a
policy granting ``caller`` ``text.echo`` and ``sdk.echo`` (cap 512 KB), then
starts two child processes (so that neither steals the other's event loop,
as when a gateway fronts an agent that already runs):

* the a2a-sdk echo agent of ``bench_a2a`` (SVIDs of its own: ``legacy`` on
  gRPC, ``legacyhttp`` on JSON-RPC) (``DefaultRequestHandler``,
  ``InMemoryTaskStore``, the echo executor) behind its ``GrpcHandler`` (mTLS)
  and its JSON-RPC routes under uvicorn (TLS, client certificate required);
* a real gateway :class:`~gateway.runtime.agent.Agent` (full policy and audit,
  ``audit_sync = "full"``, ``[a2a] http_listen``) that also fronts that sdk
  agent: ``[[upstreams]]`` over gRPC with mTLS, its skill ``echo`` served as
  ``sdk.echo`` (text in, text out), and over JSON-RPC (HTTPS, mTLS) as
  ``sdkhttp.echo``.

From this process it measures, round by round with the targets rotated:

1. **stream**: ``SendStreamingMessage`` with one data part of 256 B (and
   ``--sizes``), one stream at a time: the time to the first event (the
   task) and to the end of the stream, gateway (``text.echo``) vs the sdk
   agent, over gRPC and JSON-RPC (SSE);
2. **fronted**: ``SendMessage`` of 256 B through the gateway over gRPC
   (identity, policy, replay, input and output contracts, audit, then the
   hop to the sdk agent) vs the same message sent to the sdk agent
   directly, one at a time and 32 in flight; once with the upstream over
   gRPC (``sdk.echo``, the target) and once over JSON-RPC (``sdkhttp.echo``,
   the direct calls then JSON-RPC too).

Ratios are the sdk's time over the gateway's (streams) and the fronted calls/s
over the direct ones, both measured in the same run. Exit status 0 whatever the
ratios are, 1 when a call failed or the audit log does not hold one ``allow``
record per gateway call.
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
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
from a2a.types import a2a_pb2
from bench_a2a import (
    CALL_TIMEOUT_SECONDS,
    CONCURRENCY,
    VERSION_METADATA,
    ServerProcess,
    Target,
    drive,
    sdk_handler,
    send_request,
    start_sdk_server,
)
from bench_a2a_http import JsonRpcTarget, SdkJsonRpcServer, jsonrpc_client, jsonrpc_params
from bench_invoke import TRUST_DOMAIN, Workspace, echo_payload, make_workspace, percentile
from grpc import aio

from gateway.audit import query_records
from gateway.config import AgentConfig
from gateway.devtools.pki import issue
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial, channel_options
from policies.grants import PolicyDocument
from policies.identity import svid_dns_name
from policies.policy_file import render_policy

FRONTED = {"grpc": "sdk.echo", "jsonrpc": "sdkhttp.echo"}
"""The capability fronting the sdk agent, per binding the gateway calls it over."""
STREAM_TARGET = 1.0
"""The gateway's first streamed event at least as soon as the sdk's (sdk time / gateway time)."""
FRONTED_TARGET = 0.7
"""Fronted calls/s over direct calls/s, sequential and 32 in flight."""
PAYLOAD_CAP = 512 * 1024
LEGACY = "legacy"
"""The sdk agent's SVID name (its own identity: an agent cannot front itself)."""
LEGACY_ID = f"spiffe://{TRUST_DOMAIN}/agent/{LEGACY}"
LEGACY_HTTP = "legacyhttp"
"""The SVID name of the same agent's JSON-RPC server (one upstream entry per identity)."""
LEGACY_HTTP_ID = f"spiffe://{TRUST_DOMAIN}/agent/{LEGACY_HTTP}"


# --- server process ---------------------------------------------------------


def fronting_config(config: AgentConfig, ports: dict[str, int]) -> AgentConfig:
    """``config`` fronting the sdk agent twice: over gRPC and over JSON-RPC (HTTPS)."""

    def skill(capability: str) -> dict[str, Any]:
        return {
            "skill": "echo",
            "capability": capability,
            "version": "1.0.0",
            "risk": "read",
            "timeout": CALL_TIMEOUT_SECONDS,
        }

    upstreams = [
        {
            "id": LEGACY_ID,
            "binding": "grpc",
            "address": f"127.0.0.1:{ports['sdk_port']}",
            "skills": [skill(FRONTED["grpc"])],
        },
        {
            "id": LEGACY_HTTP_ID,
            "binding": "jsonrpc",
            "url": f"https://127.0.0.1:{ports['sdk_http_port']}{JSONRPC_PATH}",
            "skills": [skill(FRONTED["jsonrpc"])],
        },
    ]
    return AgentConfig.model_validate({**config.model_dump(), "upstreams": upstreams})


def serve_sdk(config_json: str, conn: Connection) -> None:
    """Child process entry: the sdk agent (gRPC and JSON-RPC) until told to stop."""
    asyncio.run(_serve_sdk(AgentConfig.model_validate_json(config_json), conn))
    conn.send("stopped")


async def _serve_sdk(config: AgentConfig, conn: Connection) -> None:
    pki = config.tls.ca.parent  # issue() writes NAME.pem and NAME.key beside the CA
    tls = TlsMaterial.from_files(config.tls.ca, pki / f"{LEGACY}.pem", pki / f"{LEGACY}.key")
    sdk, sdk_port = await start_sdk_server(tls, LEGACY_ID)
    legacy_tls = config.tls.model_copy(
        update={"cert": pki / f"{LEGACY_HTTP}.pem", "key": pki / f"{LEGACY_HTTP}.key"}
    )
    sdk_http = SdkJsonRpcServer(
        sdk_handler(LEGACY_HTTP_ID), config.model_copy(update={"tls": legacy_tls})
    )
    ports = {"sdk_port": sdk_port, "sdk_http_port": await sdk_http.start(), "pid": os.getpid()}
    conn.send(ports)
    try:
        await _commands(conn, None)
    finally:
        await sdk_http.stop()
        await sdk.stop(1.0)


def serve_gateway(config_json: str, conn: Connection) -> None:
    """Child process entry: the gateway (fronting the sdk agent) until told to stop."""
    asyncio.run(_serve_gateway(AgentConfig.model_validate_json(config_json), conn))
    conn.send("stopped")


async def _serve_gateway(config: AgentConfig, conn: Connection) -> None:
    agent = Agent(config)
    await agent.start(watch_policy=False)
    https_port = int(agent.https_url.rsplit(":", 1)[1])
    conn.send({"gateway_port": agent.port, "gateway_http_port": https_port, "pid": os.getpid()})
    try:
        await _commands(conn, agent)
    finally:
        await agent.stop(1.0)


async def _commands(conn: Connection, agent: Agent | None) -> None:
    loop = asyncio.get_running_loop()
    while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
        if command == "flush":
            if agent is not None:
                await agent.audit.flush()
            conn.send("flushed")


# --- streams ----------------------------------------------------------------


@dataclass
class StreamTarget:
    """``SendStreamingMessage`` to one server over one binding (a reused channel or client)."""

    name: str
    binding: str
    channel: aio.Channel | None = None
    client: httpx.AsyncClient | None = None
    url: str = ""
    server_id: str = ""
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    async def stream(self, payload: bytes) -> tuple[float, float]:
        """One stream; (ms to its first event, ms to its end)."""
        self.sent += 1
        if self.binding == "grpc":
            return await self._grpc(payload)
        return await self._sse(payload)

    async def _grpc(self, payload: bytes) -> tuple[float, float]:
        assert self.channel is not None
        request = send_request(payload)
        request.message.message_id = uuid.uuid4().hex
        stub = self.channel.unary_stream(
            "/lf.a2a.v1.A2AService/SendStreamingMessage",
            request_serializer=a2a_pb2.SendMessageRequest.SerializeToString,
            response_deserializer=a2a_pb2.StreamResponse.FromString,
        )
        started = time.perf_counter()
        first = 0.0
        last: Any = None
        try:
            async for event in stub(
                request, metadata=VERSION_METADATA, timeout=CALL_TIMEOUT_SECONDS
            ):
                first = first or time.perf_counter()
                last = event
        except aio.AioRpcError as err:
            self.errors.append(f"{err.code().name}: {err.details()}")
        ended = time.perf_counter()
        if first and not _completed_grpc(last):
            self.errors.append("the stream did not end with a completed task")
        return (first or ended) - started, ended - started

    async def _sse(self, payload: bytes) -> tuple[float, float]:
        assert self.client is not None
        params = jsonrpc_params(json.loads(payload)["text"])
        params["message"]["messageId"] = uuid.uuid4().hex
        body = {"jsonrpc": "2.0", "id": self.sent, "method": "SendStreamingMessage"}
        body["params"] = params
        started = time.perf_counter()
        first = 0.0
        last = ""
        try:
            async with self.client.stream(
                "POST",
                self.url,
                json=body,
                headers={"A2A-Version": "1.0", "Accept": "text/event-stream"},
                extensions={"sni_hostname": svid_dns_name(self.server_id)},
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        first = first or time.perf_counter()
                        last = line
        except httpx.HTTPError as err:
            self.errors.append(f"{type(err).__name__}: {err}")
        ended = time.perf_counter()
        if first and "TASK_STATE_COMPLETED" not in last:
            self.errors.append(f"the stream ended with {last[:120]}")
        elif not first:
            self.errors.append("no event")
        return (first or ended) - started, ended - started


def _completed_grpc(event: Any) -> bool:
    if event is None:
        return False
    kind = event.WhichOneof("payload")
    if kind == "task":
        return bool(event.task.status.state == a2a_pb2.TASK_STATE_COMPLETED)
    return kind == "status_update" and (
        event.status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED
    )


@dataclass(frozen=True, slots=True)
class StreamPhase:
    """One round of streams of one target."""

    target: str
    binding: str
    size: int
    first_ms: list[float]
    end_ms: list[float]


async def stream_round(
    target: StreamTarget, size: int, streams: int, budget_s: float
) -> StreamPhase:
    """Up to ``streams`` streams, one at a time, for at most ``budget_s``."""
    payload = echo_payload(size)
    firsts: list[float] = []
    ends: list[float] = []
    stop_at = time.perf_counter() + budget_s
    while len(firsts) < streams and time.perf_counter() < stop_at:
        first, end = await target.stream(payload)
        firsts.append(first * 1000.0)
        ends.append(end * 1000.0)
    return StreamPhase(target.name, target.binding, size, firsts, ends)


# --- the run ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """Command-line settings of one run."""

    streams: int
    calls: int
    rounds: int
    seconds_max: float
    sizes: tuple[int, ...]
    as_json: bool


def grant_both(ws: Workspace) -> None:
    """Rewrite the workspace policy: ``caller`` may call ``text.echo`` and ``sdk.echo``."""
    policy = PolicyDocument.model_validate(
        {
            "grants": [
                {
                    "peer": f"spiffe://{TRUST_DOMAIN}/agent/caller",
                    "capabilities": ["text.echo", *FRONTED.values()],
                    "max_payload_bytes": PAYLOAD_CAP,
                    "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
                }
            ]
        }
    )
    ws.config.policy.write_text(render_policy(policy))


async def client_run(
    ws: Workspace, ports: dict[str, int], settings: Settings
) -> tuple[list[StreamPhase], list[Any], list[Any]]:
    """Every stream round, then every fronted round; the channels closed at the end."""

    def channel(port: int, server_id: str) -> aio.Channel:
        return aio.secure_channel(
            f"127.0.0.1:{port}",
            ws.caller_tls.channel_credentials(),
            options=channel_options(server_id),
        )

    sdk_channel = channel(ports["sdk_port"], LEGACY_ID)
    gateway_channel = channel(ports["gateway_port"], ws.config.id)
    http = jsonrpc_client(ws.caller_tls)
    url = "https://127.0.0.1:{}" + JSONRPC_PATH
    streamers = [
        StreamTarget("sdk", "grpc", channel=sdk_channel),
        StreamTarget("gateway", "grpc", channel=gateway_channel),
        StreamTarget(
            "sdk",
            "jsonrpc",
            client=http,
            url=url.format(ports["sdk_http_port"]),
            server_id=LEGACY_HTTP_ID,
        ),
        StreamTarget(
            "gateway",
            "jsonrpc",
            client=http,
            url=url.format(ports["gateway_http_port"]),
            server_id=ws.config.id,
        ),
    ]
    direct_http = jsonrpc_client(ws.caller_tls)  # its own pool, as the gateway's to the sdk
    pairs: list[list[Target | JsonRpcTarget]] = [
        [
            FrontedTarget("direct grpc", sdk_channel, capability=FRONTED["grpc"]),
            FrontedTarget("fronted grpc", gateway_channel, capability=FRONTED["grpc"]),
        ],
        [
            JsonRpcTarget(
                "direct jsonrpc", url.format(ports["sdk_http_port"]), direct_http, LEGACY_HTTP_ID
            ),
            FrontedTarget("fronted jsonrpc", gateway_channel, capability=FRONTED["jsonrpc"]),
        ],
    ]
    fronted = [target for pair in pairs for target in pair]
    rounds = settings.rounds
    budget = settings.seconds_max / (rounds * (len(settings.sizes) * 4 + 2 * len(fronted)))
    phases: list[StreamPhase] = []
    calls: list[Any] = []
    try:
        for size in settings.sizes:
            for target in streamers:  # warm-up
                await stream_round(target, size, 8, 1.0)
            for number in range(rounds):
                lead = number % len(streamers)
                for target in streamers[lead:] + streamers[:lead]:
                    phases.append(await stream_round(target, size, settings.streams, budget))
        for pair in pairs:
            for concurrency in (1, CONCURRENCY):
                for fronted_target in pair:
                    await drive(fronted_target, 256, concurrency, CONCURRENCY, 1.0)
                for number in range(rounds):
                    for fronted_target in pair if number % 2 == 0 else pair[::-1]:
                        calls.append(
                            await drive(fronted_target, 256, concurrency, settings.calls, budget)
                        )
    finally:
        await sdk_channel.close()
        await gateway_channel.close()
        await http.aclose()
        await direct_http.aclose()
    return phases, calls, [*streamers, *fronted]


@dataclass
class FrontedTarget(Target):
    """``bench_a2a``'s gRPC target, naming a fronted skill in its messages."""

    capability: str = ""

    async def call(self, request: Any, text: str) -> float:
        """One SendMessage of ``capability`` (the sdk agent ignores the metadata)."""
        request.message.metadata["a2agw.capability"] = self.capability
        return await super().call(request, text)


def run(settings: Settings) -> dict[str, Any]:
    """One complete benchmark; the report as a dict."""
    with tempfile.TemporaryDirectory(prefix="bench-a2a-paths-") as tmp:
        ws = make_workspace(Path(tmp), PAYLOAD_CAP // 2, "full")
        config = AgentConfig.model_validate(
            {**ws.config.model_dump(), "a2a": {"http_listen": "127.0.0.1:0"}}
        )
        ws = Workspace(config=config, caller_tls=ws.caller_tls)
        grant_both(ws)
        issue(Path(tmp) / "pki", LEGACY)
        issue(Path(tmp) / "pki", LEGACY_HTTP)
        sdk = ServerProcess(ws.config, serve_sdk)
        gateway: ServerProcess | None = None
        try:
            ports = sdk.start()
            gateway = ServerProcess(fronting_config(ws.config, ports), serve_gateway)
            ports |= gateway.start()
            phases, calls, targets = asyncio.run(client_run(ws, ports, settings))
            gateway.flush()
        finally:
            if gateway is not None:
                gateway.stop()
            sdk.stop()
        records = query_records(open_audit_reader(ws.config.audit_db))
    gateway_calls = sum(t.sent for t in targets if t.name.split()[0] in ("gateway", "fronted"))
    allowed = sum(1 for r in records if r.decision == "allow" and r.reason == "OK")
    audit = {"records": len(records), "allow_ok": allowed, "gateway_calls": gateway_calls}
    audit["match"] = allowed == len(records) == gateway_calls
    return report(settings, phases, calls, targets, audit)


def report(
    settings: Settings,
    phases: list[StreamPhase],
    calls: list[Any],
    targets: list[Any],
    audit: dict[str, Any],
) -> dict[str, Any]:
    """Medians of rounds, the ratios and the verdicts, JSON-ready."""
    streams: dict[str, dict[str, dict[str, float]]] = {}
    for size in settings.sizes:
        for binding in ("grpc", "jsonrpc"):
            rows = streams.setdefault(f"{size} {binding}", {})
            for name in ("sdk", "gateway"):
                mine = [p for p in phases if (p.size, p.binding, p.target) == (size, binding, name)]
                firsts = [ms for p in mine for ms in p.first_ms]
                rows[name] = {
                    "first_p50_ms": statistics.median(percentile(p.first_ms, 0.5) for p in mine),
                    "first_p99_ms": percentile(firsts, 0.99),
                    "end_p50_ms": statistics.median(percentile(p.end_ms, 0.5) for p in mine),
                    "streams": len(firsts),
                }
            rows["ratio"] = {
                "first": rows["sdk"]["first_p50_ms"] / rows["gateway"]["first_p50_ms"],
                "end": rows["sdk"]["end_p50_ms"] / rows["gateway"]["end_p50_ms"],
            }
    fronted: dict[str, dict[str, float]] = {}
    for binding in FRONTED:
        for mode in ("sequential", f"conc{CONCURRENCY}"):

            def median(field: str, name: str, mode: str = mode, binding: str = binding) -> float:
                rows = [p for p in calls if (p.mode, p.target) == (mode, f"{name} {binding}")]
                return float(statistics.median(getattr(p, field) for p in rows))

            direct, through = median("calls_per_s", "direct"), median("calls_per_s", "fronted")
            fronted[f"{binding} {mode}"] = {
                "direct_calls_per_s": direct,
                "fronted_calls_per_s": through,
                "direct_p50_ms": median("p50_ms", "direct"),
                "fronted_p50_ms": median("p50_ms", "fronted"),
                "ratio": through / direct if direct else float("nan"),
            }
    first_min = min(rows["ratio"]["first"] for rows in streams.values())
    fronted_min = min(row["ratio"] for key, row in fronted.items() if key.startswith("grpc"))
    errors = {f"{t.name} ({t.binding})": t.errors[:3] for t in targets if t.errors}
    return {
        "settings": {
            "streams": settings.streams,
            "calls": settings.calls,
            "rounds": settings.rounds,
            "seconds_max": settings.seconds_max,
            "sizes": list(settings.sizes),
            "cpus": os.cpu_count(),
        },
        "streams": streams,
        "fronted": fronted,
        "verdicts": {
            "first_event": "PASS" if first_min >= STREAM_TARGET else "MISS",
            "fronted": "PASS" if fronted_min >= FRONTED_TARGET else "MISS",
        },
        "first_event_min": first_min,
        "fronted_min": fronted_min,
        "errors": errors,
        "audit": audit,
        "ok": audit["match"] and not errors,
    }


def format_text(r: dict[str, Any]) -> str:
    """The human-readable tables and RESULT block."""
    s = r["settings"]
    lines = [
        f"A2A paths benchmark: <= {s['streams']} streams / {s['calls']} calls per round, "
        f"{s['rounds']} rounds, {s['seconds_max']:g}s budget, {s['cpus']} CPUs",
        "",
        "SendStreamingMessage, one stream at a time (first event = the task)",
        f"{'payload':>7} {'binding':<8} {'target':<8} {'first p50':>10} {'first p99':>10} "
        f"{'end p50':>9} {'streams':>7}  {'sdk/gateway first, end':>22}",
    ]
    for key, rows in r["streams"].items():
        size, binding = key.split()
        for name in ("sdk", "gateway"):
            row = rows[name]
            ratio = (
                f"{rows['ratio']['first']:>13.2f}, {rows['ratio']['end']:.2f}"
                if name == "gateway"
                else ""
            )
            lines.append(
                f"{_size(int(size)):>7} {binding:<8} {name:<8} {row['first_p50_ms']:>8.3f}ms "
                f"{row['first_p99_ms']:>8.3f}ms {row['end_p50_ms']:>7.3f}ms {row['streams']:>7}  "
                f"{ratio}"
            )
    lines += [
        "",
        "Fronted a2a-sdk agent (256 B): caller -> gateway (gRPC) -> sdk agent over the upstream",
        "binding, against caller -> sdk agent over that binding",
        f"{'upstream':<8} {'mode':<11} {'direct/s':>9} {'fronted/s':>9} {'direct p50':>11} "
        f"{'fronted p50':>12} {'fronted/direct':>15}",
    ]
    for key, row in r["fronted"].items():
        binding, mode = key.split()
        lines.append(
            f"{binding:<8} {mode:<11} {row['direct_calls_per_s']:>9.1f} "
            f"{row['fronted_calls_per_s']:>9.1f} "
            f"{row['direct_p50_ms']:>9.3f}ms {row['fronted_p50_ms']:>10.3f}ms {row['ratio']:>15.2f}"
        )
    a = r["audit"]
    lines += [
        "",
        "RESULT",
        f"  first streamed event, sdk/gateway p50, every size and binding: min "
        f"{r['first_event_min']:.2f} (target >= {STREAM_TARGET:.1f})  "
        f"{r['verdicts']['first_event']}",
        f"  fronted/direct calls/s, gRPC upstream: min {r['fronted_min']:.2f} "
        f"(target >= {FRONTED_TARGET:.1f})  "
        f"{r['verdicts']['fronted']}",
        f"  audit records {a['records']} (allow OK {a['allow_ok']}) for gateway calls "
        f"{a['gateway_calls']}: {'MATCH' if a['match'] else 'MISMATCH'}",
    ]
    for name, first in r["errors"].items():
        lines.append(f"  unexpected outcomes ({name}): e.g. {first}")
    return "\n".join(lines)


def _size(size: int) -> str:
    return f"{size // 1024} KB" if size >= 1024 else f"{size} B"


def parse_args(argv: list[str] | None = None) -> Settings:
    """Command-line settings, validated."""
    parser = argparse.ArgumentParser(description="A2A first streamed event, and a fronted agent.")
    parser.add_argument("--streams", type=int, default=200, help="max streams per round")
    parser.add_argument("--calls", type=int, default=1500, help="max fronted calls per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per target")
    parser.add_argument("--seconds-max", type=float, default=60.0, help="budget of all rounds")
    parser.add_argument("--sizes", default="256", help="stream payload sizes, comma-separated")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    except ValueError:
        parser.error("--sizes must be integers separated by commas")
    if args.streams < 1 or args.calls < CONCURRENCY or args.rounds < 1 or args.seconds_max <= 0:
        parser.error(f"--streams >= 1, --calls >= {CONCURRENCY}, --rounds >= 1, --seconds-max > 0")
    if not all(16 <= size <= PAYLOAD_CAP // 2 for size in sizes):
        parser.error(f"--sizes must be within 16..{PAYLOAD_CAP // 2}")
    return Settings(args.streams, args.calls, args.rounds, args.seconds_max, sizes, args.json)


def main(argv: list[str] | None = None) -> int:
    """Run once and print; 0 unless something failed."""
    settings = parse_args(argv)
    result = run(settings)
    print(json.dumps(result, indent=2) if settings.as_json else format_text(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
