"""MCP ``tools/call`` benchmark: the gateway vs the MCP SDK's own server, same run.

Run ``python benchmarks/bench_mcp.py --help``. One run:

1. mints a PKI and a policy granting ``caller`` only ``text.echo`` (cap 64 KB
   or twice the largest payload);
2. starts, in ONE child process and one event loop, a real gateway
   :class:`~gateway.runtime.agent.Agent` serving ``[mcp] listen`` (identity,
   policy, limits, replay, validation, audit with ``audit_sync = "full"``) and
   an **sdk** server: the MCP Python SDK's low-level ``Server`` with one tool
   ``text.echo`` (its output as ``structuredContent`` and one text block, as the
   gateway answers) behind the SDK's own ``streamable_http_app`` in its fastest
   mode (stateless, JSON responses), under uvicorn with TLS that requires the
   same client certificate;
3. from this process, sends the same ``tools/call`` (arguments ``{"text": ...}``
   of 256 B and 16 KB; the 2026-07-28 revision's envelope and headers, what
   the SDK's own client sends) with one keep-alive httpx client per target (up
   to 32 connections), one call at a time and with 32 in flight, rotating the
   targets round by round; medians of rounds are reported, with the server
   process's CPU time per call of each phase;
4. checks every answer (the echoed text in ``structuredContent``) and that the
   gateway's audit log holds one record per gateway call.

Exit status 0 whatever the ratios are (a measurement, not a test), 1 when a
call failed or the audit records do not match the calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import uvicorn
from bench_a2a import ServerProcess
from bench_a2a_http import jsonrpc_client
from bench_invoke import Workspace, echo_payload, make_workspace, percentile
from mcp.server.lowlevel.server import Server

from gateway.audit import query_records
from gateway.config import AgentConfig, McpSettings
from gateway.http.listener import bind_socket
from gateway.runtime.agent import Agent
from gateway.server.a2a_http.server import KEEP_ALIVE_SECONDS
from gateway.storage import open_audit_reader
from policies.identity import svid_dns_name

SIZES = (256, 16 * 1024)
CONCURRENCY = 32
MODES = (1, CONCURRENCY)
TARGET_RATIO = 1.0
"""Gateway calls/s over sdk calls/s, at every size and mode."""
VERSION = "2026-07-28"
TOOL = "text.echo"


# --- server process ---------------------------------------------------------


def sdk_server() -> Server[Any]:
    """The SDK's echo tool: the arguments back, structured and as one text block."""

    async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return types.ListToolsResult(
            tools=[types.Tool(name=TOOL, input_schema=schema, output_schema=schema)]
        )

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        output = {"text": (params.arguments or {})["text"]}
        text = json.dumps(output, separators=(",", ":"))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=output
        )

    return Server("bench-echo", on_list_tools=list_tools, on_call_tool=call_tool)


class SdkMcpHttps:
    """The SDK's Streamable HTTP app (stateless, JSON) under uvicorn with mTLS, 127.0.0.1:0."""

    def __init__(self, config: AgentConfig) -> None:
        app = sdk_server().streamable_http_app(stateless_http=True, json_response=True)
        assert not isinstance(config.tls, dict)
        self._config = uvicorn.Config(
            app,
            http="h11",
            lifespan="on",
            log_level="warning",
            access_log=False,
            ssl_certfile=str(config.tls.cert),  # type: ignore[union-attr]
            ssl_keyfile=str(config.tls.key),  # type: ignore[union-attr]
            ssl_ca_certs=str(config.tls.ca),  # type: ignore[union-attr]
            ssl_cert_reqs=ssl.CERT_REQUIRED,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
        self._server = uvicorn.Server(self._config)
        self._sock = bind_socket("127.0.0.1", 0)
        self._loop: asyncio.Task[None] | None = None
        self.port: int = self._sock.getsockname()[1]

    async def start(self) -> int:
        """Serve (without uvicorn's signal handlers); returns the port."""
        self._config.load()
        self._server.lifespan = self._config.lifespan_class(self._config)
        await self._server.startup(sockets=[self._sock])
        self._loop = asyncio.create_task(self._server.main_loop())
        return self.port

    async def stop(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        if self._loop is not None:
            await self._loop
        await self._server.shutdown(sockets=[self._sock])


def serve_main(config_json: str, conn: Connection) -> None:
    """Child process entry: serve both servers until told to stop."""
    asyncio.run(_serve(AgentConfig.model_validate_json(config_json), conn))
    conn.send("stopped")


async def _serve(config: AgentConfig, conn: Connection) -> None:
    agent = Agent(config)
    await agent.start(watch_policy=False)
    sdk = SdkMcpHttps(config)
    ports = {
        "sdk_port": await sdk.start(),
        "gateway_port": int(agent.mcp_url.rsplit(":", 1)[1].split("/")[0]),
        "pid": os.getpid(),
    }
    conn.send(ports)
    loop = asyncio.get_running_loop()
    try:
        while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
            if command == "flush":
                await agent.audit.flush()
                conn.send("flushed")
    finally:
        await sdk.stop()
        await agent.stop(1.0)


# --- client side ------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class McpTarget:
    """One server's ``/mcp``, over one keep-alive httpx client."""

    name: str
    url: str
    client: httpx.AsyncClient
    server_id: str
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    async def call(self, text: str) -> float:
        """One ``tools/call``; returns its latency in ms."""
        self.sent += 1
        meta = {
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        body = {
            "jsonrpc": "2.0",
            "id": self.sent,
            "method": "tools/call",
            "params": {"name": TOOL, "arguments": {"text": text}, "_meta": meta},
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": "tools/call",
            "Mcp-Name": TOOL,
        }
        started = time.perf_counter()
        try:
            response = await self.client.post(
                self.url,
                json=body,
                headers=headers,
                extensions={"sni_hostname": svid_dns_name(self.server_id)},
            )
            answer = response.json()
        except (httpx.HTTPError, ValueError) as err:
            self.errors.append(f"{type(err).__name__}: {err}")
            return (time.perf_counter() - started) * 1000.0
        latency = (time.perf_counter() - started) * 1000.0
        result = answer.get("result") or {}
        if result.get("isError") or (result.get("structuredContent") or {}).get("text") != text:
            self.errors.append(f"answer {str(answer)[:200]}")
        return latency


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed run of one target at one size and concurrency."""

    target: str
    size: int
    mode: str
    calls: int
    seconds: float
    cpu_us_per_call: float
    p50_ms: float
    p99_ms: float

    @property
    def calls_per_s(self) -> float:
        """Completed calls per wall-clock second."""
        return self.calls / self.seconds if self.seconds > 0 else 0.0


async def drive(
    target: McpTarget, size: int, concurrency: int, max_calls: int, budget_s: float, pid: int
) -> Phase:
    """Up to ``max_calls`` calls, ``concurrency`` in flight, for at most ``budget_s``."""
    text = json.loads(echo_payload(size))["text"]
    latencies: list[float] = []
    issued = 0
    stop_at = time.perf_counter() + budget_s

    async def worker() -> None:
        nonlocal issued
        while issued < max_calls and time.perf_counter() < stop_at:
            issued += 1
            latencies.append(await target.call(text))

    cpu_before, started = cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu_before
    return Phase(
        target.name,
        size,
        "sequential" if concurrency == 1 else f"conc{concurrency}",
        len(latencies),
        elapsed,
        cpu / len(latencies) * 1e6 if latencies else 0.0,
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


async def measure(targets: list[McpTarget], settings: Settings, pid: int) -> list[Phase]:
    """For each size and mode: warm up, then rotate the targets round by round."""
    phases_total = len(settings.sizes) * len(MODES) * settings.rounds * len(targets)
    budget = settings.seconds_max / phases_total
    phases: list[Phase] = []
    for size in settings.sizes:
        for concurrency in MODES:
            for target in targets:
                await drive(target, size, concurrency, CONCURRENCY, min(1.0, budget), pid)
            for number in range(settings.rounds):
                lead = number % len(targets)
                for target in targets[lead:] + targets[:lead]:
                    phases.append(
                        await drive(target, size, concurrency, settings.calls, budget, pid)
                    )
    return phases


async def client_run(
    ws: Workspace, ports: dict[str, int], settings: Settings
) -> tuple[list[Phase], list[McpTarget]]:
    """Open the clients, run every phase, close the clients."""
    targets = [
        McpTarget(
            name,
            f"https://127.0.0.1:{ports[port]}/mcp",
            jsonrpc_client(ws.caller_tls),
            ws.config.id,
        )
        for name, port in (("sdk", "sdk_port"), ("gateway", "gateway_port"))
    ]
    try:
        phases = await measure(targets, settings, ports["pid"])
    finally:
        for target in targets:
            await target.client.aclose()
    return phases, targets


def run(settings: Settings) -> dict[str, Any]:
    """One complete benchmark; returns the report as a dict."""
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        ws = make_workspace(Path(tmp), max(settings.sizes), "full")
        mcp = ws.config.model_copy(update={"mcp": McpSettings(listen="127.0.0.1:0")})
        ws = Workspace(config=mcp, caller_tls=ws.caller_tls)
        server = ServerProcess(ws.config, serve_main)
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
    """Median of rounds per (size, mode) and target."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for key in dict.fromkeys((p.size, p.mode) for p in phases):
        for target in ("sdk", "gateway"):
            rounds = [p for p in phases if (p.size, p.mode) == key and p.target == target]
            summary.setdefault(f"{key[0]} {key[1]}", {})[target] = {
                "calls_per_s": statistics.median(p.calls_per_s for p in rounds),
                "cpu_us_per_call": statistics.median(p.cpu_us_per_call for p in rounds),
                "p50_ms": statistics.median(p.p50_ms for p in rounds),
                "p99_ms": statistics.median(p.p99_ms for p in rounds),
                "calls": sum(p.calls for p in rounds),
            }
    return summary


def build_report(
    settings: Settings,
    ports: dict[str, int],
    phases: list[Phase],
    targets: list[McpTarget],
    audit: dict[str, Any],
) -> dict[str, Any]:
    """The whole report, JSON-ready."""
    summary = summarize(phases)

    def ratio(rows: dict[str, dict[str, float]], metric: str) -> float:
        sdk = rows["sdk"][metric]
        return rows["gateway"][metric] / sdk if sdk else float("nan")

    ratios = {key: ratio(rows, "calls_per_s") for key, rows in summary.items()}
    cpu_ratios = {key: ratio(rows, "cpu_us_per_call") for key, rows in summary.items()}
    return {
        "settings": {
            "calls": settings.calls,
            "seconds_max": settings.seconds_max,
            "rounds": settings.rounds,
            "sizes": list(settings.sizes),
            "concurrency": CONCURRENCY,
            "protocol_version": VERSION,
            "audit_sync": "full",
            "cpus": os.cpu_count(),
            "server_pid": ports.get("pid"),
        },
        "summary": summary,
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        "target_ratio": TARGET_RATIO,
        "verdict": "PASS" if all(r >= TARGET_RATIO for r in ratios.values()) else "MISS",
        "errors": {t.name: {"count": len(t.errors), "first": t.errors[:3]} for t in targets},
        "audit": audit,
        "ok": audit["match"] and not any(t.errors for t in targets),
    }


def format_text(report: dict[str, Any]) -> str:
    """The human-readable table and RESULT block."""
    s = report["settings"]
    lines = [
        f"MCP tools/call benchmark: <= {s['calls']} calls per phase, {s['seconds_max']:g}s "
        f"budget, {s['rounds']} rounds, {s['cpus']} CPUs, MCP {s['protocol_version']}, "
        f"gateway audit_sync {s['audit_sync']}, servers in pid {s['server_pid']}",
        "",
        f"{'payload':>7} {'mode':<11} {'target':<8} {'calls/s':>8} {'cpu us':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'calls':>6}  {'gateway/sdk':>11} {'cpu g/s':>8}",
    ]
    for key, rows in report["summary"].items():
        size, mode = key.split()
        for target in ("sdk", "gateway"):
            row = rows[target]
            tail = (
                f"{report['ratios'][key]:>11.2f} {report['cpu_ratios'][key]:>8.2f}"
                if target == "gateway"
                else ""
            )
            lines.append(
                f"{_size(int(size)):>7} {mode:<11} {target:<8} {row['calls_per_s']:>8.1f} "
                f"{row['cpu_us_per_call']:>8.0f} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
                f"{row['calls']:>6}  {tail}"
            )
    a = report["audit"]
    ratios = list(report["ratios"].values())
    lines += [
        "",
        "medians of rounds; cpu us = the server process's CPU per call; sdk = the MCP SDK's "
        "low-level Server behind its streamable_http_app (stateless, JSON) under uvicorn "
        "(TLS, client certificate required)",
        "",
        "RESULT",
        f"  gateway/sdk calls/s, every size and mode: min {min(ratios):.2f} "
        f"(target >= {report['target_ratio']:.1f})  {report['verdict']}",
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
    parser = argparse.ArgumentParser(description="MCP SDK server vs gateway tools/call.")
    parser.add_argument("--calls", type=int, default=800, help="max calls per phase")
    parser.add_argument(
        "--seconds-max", type=float, default=150.0, help="time budget of all measured phases"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per target, size and mode")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="payload sizes in bytes, comma-separated"
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
    return Settings(args.calls, args.seconds_max, args.rounds, sizes, args.json)


def main(argv: list[str] | None = None) -> int:
    """Run once; print the report; 1 if a call failed or the audit does not match."""
    settings = parse_args(argv)
    report = run(settings)
    print(json.dumps(report, indent=2) if settings.as_json else format_text(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
