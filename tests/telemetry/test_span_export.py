"""An unreachable collector is reported once and backed off; ``console = true`` prints spans."""

from __future__ import annotations

import logging
import socket
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from gateway.client.peer_client import PeerClient
from gateway.config import TracingSettings
from gateway.telemetry.span_export import BackoffExporter, span_line
from tests.helpers.agents import Pki, agent_config, audit_rows, grant, started, write_policy


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spans(count: int) -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("test")
    made = []
    for n in range(count):
        span = tracer.start_span(f"s{n}", attributes={"a2agw.capability": "text.echo"})
        span.end()
        made.append(span)
    return made


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """A real OTLP/gRPC trace collector on loopback that keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _warnings_and_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_an_unreachable_collector_is_reported_once_then_backed_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    port = _free_port()  # nothing listens here yet
    endpoint = f"127.0.0.1:{port}"
    now = [0.0]
    exporter = BackoffExporter(
        OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=3),
        endpoint,
        first_pause=5.0,
        max_pause=60.0,
        clock=lambda: now[0],
    )
    for moment in (0.0, 1.0, 2.0, 4.9, 5.1, 6.0, 14.0, 15.2):
        now[0] = moment
        assert exporter.export(_spans(2)) is SpanExportResult.FAILURE
    # Tried at 0 (pause 5), 5.1 (pause 10), 15.2: the rest dropped without a try.
    assert exporter.attempts == 3
    noisy = _warnings_and_errors(caplog)
    assert [r.getMessage() for r in noisy] == [
        f"tracing: OTLP collector {endpoint} unreachable; spans are dropped and export is "
        "retried with a growing pause (up to 60s)"
    ]

    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    server.add_insecure_port(endpoint)
    server.start()
    try:
        caplog.clear()
        failed = 0  # the exporter's channel may still be in its own reconnect backoff
        for round_ in range(1, 6):
            now[0] = 1000.0 * round_  # past any pause
            if exporter.export(_spans(1)) is SpanExportResult.SUCCESS:
                break
            failed += 1
        else:
            raise AssertionError("the collector never received a batch")
    finally:
        server.stop(None)
        exporter.shutdown()
    assert len(collector.received) == 1
    assert [r.getMessage() for r in _warnings_and_errors(caplog)] == [
        f"tracing: OTLP collector {endpoint} reachable again "
        f"({16 + failed} spans dropped meanwhile)"
    ]


@pytest.mark.slow
async def test_console_prints_spans_and_a_dead_collector_is_one_warning(
    pki: Pki,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    dead = f"127.0.0.1:{_free_port()}"
    tracing = TracingSettings(enabled=True, console=True, otlp_endpoint=dead)
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(update={"tracing": tracing})
    agent = await started(config)
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            await bob.invoke("text.echo", {"text": "not-in-any-span"})
    finally:
        await agent.stop()  # flushes both exporters
    err = capsys.readouterr().err
    [record] = [r for r in audit_rows(config.audit_db) if r.capability == "text.echo"]
    lines = [line for line in err.splitlines() if line.startswith("span ")]
    invoke = [line for line in lines if line.startswith("span Invoke ")]
    assert len(invoke) == 1, err
    assert f" trace={record.trace_id} " in invoke[0]
    assert "a2agw.capability=text.echo" in invoke[0]
    assert "not-in-any-span" not in err
    noisy = [
        r
        for r in _warnings_and_errors(caplog)
        if "opentelemetry" in r.name or "OTLP" in r.getMessage()
    ]
    assert [r.getMessage() for r in noisy] == [
        f"tracing: OTLP collector {dead} unreachable; spans are dropped and export is "
        "retried with a growing pause (up to 300s)"
    ]


def test_a_span_line_is_one_escaped_line() -> None:
    tracer = TracerProvider().get_tracer("test")
    span = tracer.start_span("Invoke", attributes={"a2agw.capability": "kv.get\n\x1b[2Jforged"})
    span.end()
    line = span_line(span)
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("span Invoke trace=") and " parent=- " in line
