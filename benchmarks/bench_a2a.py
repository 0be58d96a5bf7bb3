"""A2A SendMessage benchmark: the gateway vs the a2a-sdk's own servers, gRPC and JSON-RPC, same run.

Run ``python benchmarks/bench_a2a.py --help``. One run:

1. mints a PKI and a policy granting ``caller`` only ``text.echo`` (cap 512 KB);
2. starts, in ONE child process and one event loop, a real gateway
   :class:`~gateway.runtime.agent.Agent` (identity, policy, replay, validation, audit
   with ``audit_sync = "full"``, task table) and an **sdk** echo agent: the
   a2a-sdk's ``DefaultRequestHandler`` (``InMemoryTaskStore``) behind its
   ``GrpcHandler``, same mTLS credentials (``require_client_auth``), same server
   options; its executor answers each message with one completed task whose
   artifact holds the message's data part (the least an A2A agent can do;
   in this process the sdk's JSON-RPC routes answer through the gateway's
   faster JSON classes too, ``gateway/server/a2a_http/fast_json.py``, which are
   module-wide: the JSON-RPC ratios understate the gateway);
   with the ``jsonrpc`` binding also the gateway's ``[a2a] http_listen`` and the
   same sdk agent behind the a2a-sdk's own JSON-RPC routes under uvicorn with
   TLS (``bench_a2a_http``);
3. from this process, sends the same ``SendMessage`` (one ``data`` part
   ``{"text": ...}`` of 256 B, 16 KB and 256 KB; metadata
   ``a2agw.capability = text.echo``; a fresh ``message_id`` each) over one
   channel (JSON-RPC: one keep-alive httpx client) per target, one at a time
   and with 32 in flight, rotating the targets round by round; medians of rounds are reported;
4. checks every answer (a completed task echoing the text) and that the
   gateway's audit log holds one record per gateway call.

Servers and client live in different processes so that neither steals event
loop time from the other. Exit status 0 whatever the ratios are (a measurement,
not a test), 1 when a call failed or the audit records do not match the calls.

Time to first streamed event and a fronted a2a-sdk agent (``[[upstreams]]``)
against calling it directly are measured by ``bench_a2a_paths.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import a2a_pb2, a2a_pb2_grpc
from bench_a2a_http import (
    FloorJsonRpcServer,
    JsonRpcTarget,
    SdkJsonRpcServer,
    jsonrpc_client,
    jsonrpc_params,
)
from bench_invoke import Workspace, echo_payload, make_workspace, percentile
from google.protobuf import json_format
from grpc import aio

from gateway.audit import query_records
from gateway.config import A2ASettings, AgentConfig
from gateway.runtime.agent import Agent
from gateway.server.a2a import public_card
from gateway.server.a2a_http import JSONRPC_PATH
from gateway.storage import open_audit_reader
from gateway.transport.tls import TlsMaterial, channel_options, server_options

SIZES = (256, 16 * 1024, 256 * 1024)
CONCURRENCY = 32
MODES = (1, CONCURRENCY)
BINDINGS = ("grpc", "jsonrpc")
TARGET_RATIOS = {"grpc": 2.0, "jsonrpc": 1.0}
"""Gateway calls/s over sdk calls/s, at every size and mode, per binding."""
SMALL_TARGET_RATIOS = {"jsonrpc": 2.0}
"""Gateway calls/s over sdk calls/s at 256 B, one call at a time (the fixed per-call work)."""
SMALL_KEY = "256 sequential"
CALL_TIMEOUT_SECONDS = 20.0
VERSION_METADATA = (("a2a-version", "1.0"),)


# --- server process ---------------------------------------------------------


class EchoExecutor(AgentExecutor):
    """The sdk baseline: one completed task whose artifact is the message's data part."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Answer with a finished task at once."""
        assert context.message is not None and context.task_id and context.context_id
        task = a2a_pb2.Task(id=context.task_id, context_id=context.context_id)
        task.status.state = a2a_pb2.TASK_STATE_COMPLETED
        artifact = task.artifacts.add(artifact_id=f"{context.task_id}-output", name="echo")
        artifact.parts.add().CopyFrom(context.message.parts[0])
        await event_queue.enqueue_event(task)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Nothing runs long enough to cancel."""


def sdk_handler(agent_id: str) -> DefaultRequestHandler:
    """The a2a-sdk's request handler of the echo agent (its own in-memory task store)."""
    card = public_card(agent_id, "127.0.0.1:0")
    card.skills.add(id="echo", name="echo", description="Echo the data part.", tags=["echo"])
    return DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )


async def start_sdk_server(tls: TlsMaterial, agent_id: str) -> tuple[aio.Server, int]:
    """The a2a-sdk echo agent on 127.0.0.1, built like ``GatewayServer`` (mTLS, options)."""
    server = aio.server(options=server_options())
    handler = sdk_handler(agent_id)
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)  # type: ignore[no-untyped-call]
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    return server, port


def serve_main(config_json: str, conn: Connection) -> None:
    """Child process entry: serve both servers until told to stop."""
    asyncio.run(_serve(AgentConfig.model_validate_json(config_json), conn))
    conn.send("stopped")


async def _serve(config: AgentConfig, conn: Connection) -> None:
    agent = Agent(config)
    await agent.start(watch_policy=False)
    sdk, sdk_port = await start_sdk_server(agent.tls, config.id)
    ports = {"sdk_port": sdk_port, "gateway_port": agent.port, "pid": os.getpid()}
    sdk_http = floor_http = None
    if config.a2a.http_listen is not None:
        sdk_http = SdkJsonRpcServer(sdk_handler(config.id), config)
        ports["sdk_http_port"] = await sdk_http.start()
        floor_http = FloorJsonRpcServer(config)
        ports["floor_http_port"] = await floor_http.start()
        ports["gateway_http_port"] = int(agent.https_url.rsplit(":", 1)[1])
    conn.send(ports)
    loop = asyncio.get_running_loop()
    try:
        while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
            if command == "flush":
                await agent.audit.flush()
                conn.send("flushed")
    finally:
        for http_server in (sdk_http, floor_http):
            if http_server is not None:
                await http_server.stop()
        await sdk.stop(1.0)
        await agent.stop(1.0)


class ServerProcess:
    """The child process hosting both servers, and its command pipe."""

    def __init__(
        self, config: AgentConfig, entry: Callable[[str, Connection], None] | None = None
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(
            target=serve_main if entry is None else entry,
            args=(config.model_dump_json(), child_conn),
            name="bench-a2a-servers",
            daemon=True,
        )

    def start(self, timeout: float = 60.0) -> dict[str, int]:
        """Start the child; returns its ports and pid once it serves."""
        self._process.start()
        if not self._conn.poll(timeout):
            raise RuntimeError(f"the server process did not start within {timeout:g}s")
        ports: dict[str, int] = self._conn.recv()
        return ports

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until the gateway's audit writer has committed everything queued."""
        self._conn.send("flush")
        if self._conn.poll(timeout):
            self._conn.recv()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the child to stop (which flushes the audit log) and wait for it."""
        if self._process.is_alive():
            self._conn.send("stop")
            if self._conn.poll(timeout):
                self._conn.recv()
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5.0)


# --- client side ------------------------------------------------------------


def send_request(text_payload: bytes) -> a2a_pb2.SendMessageRequest:
    """The SendMessage both targets get: one data part ``{"text": ...}``."""
    message = a2a_pb2.Message(role=a2a_pb2.ROLE_USER)
    message.metadata["a2agw.capability"] = "text.echo"
    json_format.Parse(text_payload, message.parts.add().data)
    return a2a_pb2.SendMessageRequest(message=message)


@dataclass
class Target:
    """One server, over its own reused channel."""

    name: str
    channel: aio.Channel
    binding: str = "grpc"
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stub: Any = a2a_pb2_grpc.A2AServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def call(self, request: Any, text: str) -> float:
        """One SendMessage with a fresh message id; returns its latency in ms."""
        self.sent += 1
        request.message.message_id = uuid.uuid4().hex
        started = time.perf_counter()
        try:
            reply = await self.stub.SendMessage(
                request, metadata=VERSION_METADATA, timeout=CALL_TIMEOUT_SECONDS
            )
        except aio.AioRpcError as err:
            self.errors.append(f"{err.code().name}: {err.details()}")
            return (time.perf_counter() - started) * 1000.0
        latency = (time.perf_counter() - started) * 1000.0
        task = reply.task
        if task.status.state != a2a_pb2.TASK_STATE_COMPLETED:
            self.errors.append(f"task state {task.status.state}")
        elif task.artifacts[0].parts[0].data.struct_value.fields["text"].string_value != text:
            self.errors.append("the echo did not return the text")
        return latency


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed run of one target at one size and concurrency."""

    target: str
    binding: str
    size: int
    mode: str
    calls: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def calls_per_s(self) -> float:
        """Completed calls per wall-clock second."""
        return self.calls / self.seconds if self.seconds > 0 else 0.0


async def drive(
    target: Target | JsonRpcTarget, size: int, concurrency: int, max_calls: int, budget_s: float
) -> Phase:
    """Up to ``max_calls`` calls, ``concurrency`` in flight, for at most ``budget_s``."""
    payload = echo_payload(size)
    text = json.loads(payload)["text"]
    latencies: list[float] = []
    issued = 0
    stop_at = time.perf_counter() + budget_s

    async def worker() -> None:
        nonlocal issued
        # One request per worker: the message id is set per call.
        request = send_request(payload) if target.binding == "grpc" else jsonrpc_params(text)
        while issued < max_calls and time.perf_counter() < stop_at:
            issued += 1
            latencies.append(await target.call(request, text))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    mode = "sequential" if concurrency == 1 else f"conc{concurrency}"
    return Phase(
        target.name,
        target.binding,
        size,
        mode,
        len(latencies),
        elapsed,
        percentile(latencies, 0.50),
        percentile(latencies, 0.99),
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """Command-line settings of one run."""

    calls: int
    seconds_max: float
    rounds: int
    sizes: tuple[int, ...]
    as_json: bool
    bindings: tuple[str, ...] = BINDINGS
    floor: bool = False


def max_calls_for(settings: Settings, size: int) -> int:
    """A quarter of the calls for payloads above 64 KB (each costs far more)."""
    return settings.calls if size <= 64 * 1024 else max(CONCURRENCY * 2, settings.calls // 4)


async def measure(targets: list[Target | JsonRpcTarget], settings: Settings) -> list[Phase]:
    """For each size and mode: warm up, then rotate the targets round by round."""
    phases_total = len(settings.sizes) * len(MODES) * settings.rounds * len(targets)
    budget = settings.seconds_max / phases_total
    phases: list[Phase] = []
    for size in settings.sizes:
        calls = max_calls_for(settings, size)
        for concurrency in MODES:
            for target in targets:
                await drive(target, size, concurrency, CONCURRENCY, min(1.0, budget))
            for number in range(settings.rounds):
                lead = number % len(targets)
                for target in targets[lead:] + targets[:lead]:
                    phases.append(await drive(target, size, concurrency, calls, budget))
    return phases


async def client_run(
    ws: Workspace, ports: dict[str, int], settings: Settings
) -> tuple[list[Phase], list[Target | JsonRpcTarget]]:
    """Open the channels, run every phase, close the channels."""

    def channel(port: int) -> aio.Channel:
        return aio.secure_channel(
            f"127.0.0.1:{port}",
            ws.caller_tls.channel_credentials(),
            options=channel_options(ws.config.id),
        )

    targets: list[Target | JsonRpcTarget] = []
    if "grpc" in settings.bindings:
        targets += [
            Target("sdk", channel(ports["sdk_port"])),
            Target("gateway", channel(ports["gateway_port"])),
        ]
    if "jsonrpc" in settings.bindings:
        names = [("sdk", "sdk_http_port"), ("gateway", "gateway_http_port")]
        if settings.floor:
            names.append(("floor", "floor_http_port"))
        targets += [
            JsonRpcTarget(
                name,
                f"https://127.0.0.1:{ports[port]}{JSONRPC_PATH}",
                jsonrpc_client(ws.caller_tls),
                ws.config.id,
            )
            for name, port in names
        ]
    try:
        phases = await measure(targets, settings)
    finally:
        for target in targets:
            if isinstance(target, Target):
                await target.channel.close()
            else:
                await target.close()
    return phases, targets


def run(settings: Settings) -> dict[str, Any]:
    """One complete benchmark; returns the report as a dict."""
    with tempfile.TemporaryDirectory(prefix="bench-a2a-") as tmp:
        ws = make_workspace(Path(tmp), max(settings.sizes), "full")
        if "jsonrpc" in settings.bindings:
            https = ws.config.model_copy(update={"a2a": A2ASettings(http_listen="127.0.0.1:0")})
            ws = Workspace(config=https, caller_tls=ws.caller_tls)
        server = ServerProcess(ws.config)
        try:
            ports = server.start()
            phases, targets = asyncio.run(client_run(ws, ports, settings))
            server.flush()
        finally:
            server.stop()
        records = query_records(open_audit_reader(ws.config.audit_db))
    gateway_calls = sum(t.sent for t in targets if t.name == "gateway")
    allowed = sum(1 for r in records if r.decision == "allow" and r.reason == "OK")
    audit = {"records": len(records), "allow_ok": allowed, "gateway_calls": gateway_calls}
    audit["match"] = allowed == len(records) == gateway_calls
    return build_report(settings, ports, phases, targets, audit)


# --- report -----------------------------------------------------------------


def summarize(phases: list[Phase]) -> dict[str, dict[str, dict[str, float]]]:
    """Median of rounds per (size, mode, binding) and target."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for key in dict.fromkeys((p.size, p.mode, p.binding) for p in phases):
        for target in ("sdk", "gateway", "floor"):
            rounds = [
                p for p in phases if (p.size, p.mode, p.binding) == key and p.target == target
            ]
            if not rounds:
                continue
            summary.setdefault(f"{key[0]} {key[1]} {key[2]}", {})[target] = {
                "calls_per_s": statistics.median(p.calls_per_s for p in rounds),
                "p50_ms": statistics.median(p.p50_ms for p in rounds),
                "p99_ms": statistics.median(p.p99_ms for p in rounds),
                "calls": sum(p.calls for p in rounds),
            }
    return summary


def build_report(
    settings: Settings,
    ports: dict[str, int],
    phases: list[Phase],
    targets: list[Target | JsonRpcTarget],
    audit: dict[str, Any],
) -> dict[str, Any]:
    """The whole report, JSON-ready."""
    summary = summarize(phases)
    ratios = {
        key: rows["gateway"]["calls_per_s"] / rows["sdk"]["calls_per_s"]
        if rows["sdk"]["calls_per_s"]
        else float("nan")
        for key, rows in summary.items()
    }
    floor_ratios = {
        key: rows["floor"]["calls_per_s"] / rows["sdk"]["calls_per_s"]
        for key, rows in summary.items()
        if "floor" in rows and rows["sdk"]["calls_per_s"]
    }
    return {
        "settings": {
            "calls": settings.calls,
            "seconds_max": settings.seconds_max,
            "rounds": settings.rounds,
            "sizes": list(settings.sizes),
            "bindings": list(settings.bindings),
            "concurrency": CONCURRENCY,
            "audit_sync": "full",
            "cpus": os.cpu_count(),
            "server_pid": ports.get("pid"),
        },
        "summary": summary,
        "ratios": ratios,
        "floor_ratios": floor_ratios,
        "target_ratios": TARGET_RATIOS,
        "small_target_ratios": SMALL_TARGET_RATIOS,
        "verdicts": {
            binding: "PASS" if _meets_targets(binding, ratios) else "MISS"
            for binding in settings.bindings
        },
        "errors": {
            f"{t.name} {t.binding}": {"count": len(t.errors), "first": t.errors[:3]}
            for t in targets
        },
        "audit": audit,
        "ok": audit["match"] and not any(t.errors for t in targets),
    }


def _meets_targets(binding: str, ratios: dict[str, float]) -> bool:
    floor = all(r >= TARGET_RATIOS[binding] for k, r in ratios.items() if k.endswith(binding))
    small = ratios.get(f"{SMALL_KEY} {binding}")
    wanted = SMALL_TARGET_RATIOS.get(binding)
    return floor and (small is None or wanted is None or small >= wanted)


def format_text(report: dict[str, Any]) -> str:
    """The human-readable table and RESULT block."""
    s = report["settings"]
    lines = [
        f"A2A SendMessage benchmark: <= {s['calls']} calls per phase, {s['seconds_max']:g}s "
        f"budget, {s['rounds']} rounds, {s['cpus']} CPUs, gateway audit_sync {s['audit_sync']}, "
        f"servers in pid {s['server_pid']}",
        "",
        f"{'payload':>7} {'mode':<11} {'binding':<8} {'target':<8} {'calls/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'calls':>6}  {'x/sdk':>11}",
    ]
    for key, rows in report["summary"].items():
        size, mode, binding = key.split()
        for target in (name for name in ("sdk", "gateway", "floor") if name in rows):
            row = rows[target]
            ratio = {
                "gateway": f"{report['ratios'][key]:>11.2f}",
                "floor": f"{report['floor_ratios'].get(key, float('nan')):>11.2f}",
            }.get(target, "")
            lines.append(
                f"{_size(int(size)):>7} {mode:<11} {binding:<8} {target:<8} "
                f"{row['calls_per_s']:>8.1f} "
                f"{row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} {row['calls']:>6}  {ratio}"
            )
    a = report["audit"]
    lines += [
        "",
        "medians of rounds; sdk = a2a-sdk DefaultRequestHandler echo agent behind its "
        "GrpcHandler (mTLS) / its JSON-RPC routes under uvicorn (TLS, client cert required); "
        "floor = a null echo route on the same uvicorn, TLS and Starlette (--floor)",
        "",
        "RESULT",
    ]
    for binding, verdict in report["verdicts"].items():
        ratios = [r for k, r in report["ratios"].items() if k.endswith(binding)]
        lines.append(
            f"  {binding}: gateway/sdk calls/s, every size and mode: min {min(ratios):.2f} "
            f"(target >= {report['target_ratios'][binding]:.1f})  {verdict}"
        )
        small = report["ratios"].get(f"{SMALL_KEY} {binding}")
        wanted = report["small_target_ratios"].get(binding)
        if small is not None and wanted is not None:
            lines.append(
                f"  {binding}: gateway/sdk calls/s at 256 B, sequential: {small:.2f} "
                f"(target >= {wanted:.1f})"
            )
        floor = report["floor_ratios"].get(f"{SMALL_KEY} {binding}")
        if floor is not None:
            lines.append(
                f"  {binding}: floor/sdk calls/s at 256 B, sequential: {floor:.2f} "
                "(the most any server on this stack reaches through this client)"
            )
    lines += [
        f"  audit records {a['records']} (allow OK {a['allow_ok']}) for gateway calls "
        f"{a['gateway_calls']}: {'MATCH' if a['match'] else 'MISMATCH'}",
    ]
    for name, err in report["errors"].items():
        if err["count"]:
            lines.append(f"  unexpected outcomes ({name}): {err['count']}, e.g. {err['first']}")
    return "\n".join(lines)


def _size(size: int) -> str:
    return f"{size // 1024} KB" if size >= 1024 else f"{size} B"


def parse_args(argv: list[str] | None = None) -> Settings:
    """Command-line settings, validated."""
    parser = argparse.ArgumentParser(description="a2a-sdk server vs gateway SendMessage.")
    parser.add_argument("--calls", type=int, default=1500, help="max calls per phase (256 B)")
    parser.add_argument(
        "--seconds-max", type=float, default=90.0, help="time budget of all measured phases"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds per target, size and mode")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="payload sizes in bytes, comma-separated"
    )
    parser.add_argument(
        "--bindings", default=",".join(BINDINGS), help="grpc and/or jsonrpc, comma-separated"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure a null JSON-RPC echo route on the same stack (the stack's ceiling)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    except ValueError:
        parser.error("--sizes must be integers separated by commas")
    if args.calls < CONCURRENCY or args.rounds < 1 or args.seconds_max <= 0:
        parser.error(f"--calls must be >= {CONCURRENCY}, --rounds >= 1, --seconds-max > 0")
    if not all(16 <= size <= 1024 * 1024 for size in sizes):
        parser.error("--sizes must be within 16..1048576")
    bindings = tuple(b for b in args.bindings.split(",") if b)
    if not bindings or not set(bindings) <= set(BINDINGS):
        parser.error("--bindings: grpc and/or jsonrpc")
    return Settings(
        args.calls, args.seconds_max, args.rounds, sizes, args.json, bindings, args.floor
    )


def main(argv: list[str] | None = None) -> int:
    """Run once and print; 0 unless something failed."""
    settings = parse_args(argv)
    report = run(settings)
    print(json.dumps(report, indent=2) if settings.as_json else format_text(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
