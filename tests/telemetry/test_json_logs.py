"""JSON logs: one object per line, multi-line messages as one event, trace ids, no payloads."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.main import log_formatter
from gateway.config import TracingSettings
from gateway.display import EscapingFormatter
from gateway.telemetry.json_logs import JsonFormatter
from gateway.telemetry.tracing import AgentTracing
from policies.store import PolicyStore
from tests.helpers.agents import grant, spiffe, write_policy


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(spiffe("alice")))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield stream
    finally:
        root.removeHandler(handler)


def _events(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_rejected_policy_reload_is_one_event_on_one_line(
    tmp_path: Path, captured: io.StringIO
) -> None:
    path = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    store = PolicyStore(path)
    # Two problems: the message lists them on several lines.
    path.write_text(
        '[[grants]]\npeer = "not-a-spiffe-id"\ncapabilities = ["text.echo"]\n'
        'max_payload_bytes = -1\nexpires_at = "2030-01-01T00:00:00Z"\n'
    )

    error = store.reload()

    assert error is not None and "\n" in error.message
    (event,) = [e for e in _events(captured) if "policy reload rejected" in str(e["event"])]
    assert event["level"] == "ERROR"
    assert event["reason"] == "POLICY_INVALID"
    assert event["agent"] == spiffe("alice")
    assert error.message in str(event["event"])
    assert store.reloads_rejected == 1


def test_a_log_line_inside_a_span_carries_its_trace_id(captured: io.StringIO) -> None:
    tracing = AgentTracing(spiffe("alice"), TracingSettings())
    with tracing.span("work", {}) as span:
        logging.getLogger("gateway.test").warning(
            "peer refused", extra={"peer": spiffe("bob"), "capability": "kv.put"}
        )
        trace_id = format(span.get_span_context().trace_id, "032x")
    tracing.shutdown()
    (event,) = [e for e in _events(captured) if e["event"] == "peer refused"]
    assert event["trace_id"] == trace_id
    assert (event["peer"], event["capability"]) == (spiffe("bob"), "kv.put")


def test_control_characters_cannot_forge_a_second_line(captured: io.StringIO) -> None:
    logging.getLogger("gateway.test").warning("name %s", 'x\n{"event": "forged"}\x1b[2J')
    lines = captured.getvalue().splitlines()
    assert len(lines) == 1
    assert "\x1b" not in lines[0]
    assert json.loads(lines[0])["event"] == 'name x\n{"event": "forged"}\x1b[2J'


def test_json_unless_text_is_asked_for_or_a_person_reads_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(log_formatter("json"), JsonFormatter)
    assert isinstance(log_formatter("text"), EscapingFormatter)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert isinstance(log_formatter(None), JsonFormatter)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert isinstance(log_formatter(None), EscapingFormatter)
