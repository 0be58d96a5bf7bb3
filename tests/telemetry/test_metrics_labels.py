"""Metric labels come from bounded sets, and the exposition text is always valid.

Callers choose the capability names they send; a peer inventing thousands of
them must not add a series each (nor push the SDK into its overflow series,
whose label name Prometheus would reject, losing the whole scrape).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import MetricsSettings
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from gateway.telemetry.metrics import OTHER_CAPABILITY, AgentMetrics
from gateway.telemetry.prometheus_text import label_name
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    write_policy,
)
from tests.helpers.exposition import LABEL_NAME, samples

DISTINCT_NAMES = 2_100  # above the SDK's default cardinality limit (2,000)


def _record(capability: str, reason: str = "UNKNOWN_PEER", detail: str = "") -> dict[str, Any]:
    return {
        "capability": capability,
        "decision": "allow" if reason == "OK" else "refuse",
        "reason": reason,
        "peer_id": spiffe("dave"),
        "latency_ms": 1.5,
        "detail": detail,
    }


def _metrics() -> AgentMetrics:
    metrics = AgentMetrics(spiffe("alice"), MetricsSettings(listen="127.0.0.1:0"))
    metrics.label_capabilities(["text.echo", "kv.get"])
    return metrics


def _decisions(text: str) -> Counter[tuple[str, str]]:
    counted: Counter[tuple[str, str]] = Counter()
    for name, labels in samples(text):
        if name == "a2agw_decisions_total":
            counted[(labels["capability"], labels["reason"])] += 1
    return counted


def test_unregistered_capability_names_share_one_label_value() -> None:
    metrics = _metrics()
    invented = [_record(f'made.up.{n}\n"x\\') for n in range(DISTINCT_NAMES)]
    metrics.audit_committed([*invented, _record("text.echo", "OK"), _record("")], 0.001)
    text = metrics.prometheus_text()
    metrics.shutdown()

    assert _decisions(text) == {
        (OTHER_CAPABILITY, "UNKNOWN_PEER"): 1,
        ("text.echo", "OK"): 1,
        ("", "UNKNOWN_PEER"): 1,
    }
    assert f'a2agw_decisions_total{{capability="{OTHER_CAPABILITY}",' in text
    assert f'decision="refuse",reason="UNKNOWN_PEER"}} {DISTINCT_NAMES}' in text
    durations = {
        labels["capability"]
        for name, labels in samples(text)
        if name == "a2agw_call_duration_seconds_count"
    }
    assert durations == {OTHER_CAPABILITY, "text.echo", ""}
    assert "made.up" not in text


def test_every_label_name_is_legal_even_for_the_sdk_overflow_series() -> None:
    metrics = _metrics()
    # An instrument fed by a component with more label sets than the SDK keeps:
    # the SDK then adds its own series labelled otel.metric.overflow.
    metrics.observe_counter(
        "a2agw_test_many", "many label sets", lambda: [({"n": str(n)}, 1) for n in range(2_100)]
    )
    text = metrics.prometheus_text()
    metrics.shutdown()

    found = samples(text)
    names = {label for _, labels in found for label in labels}
    assert all(LABEL_NAME.fullmatch(label) for label in names)
    assert "otel_metric_overflow" in names  # the SDK's overflow series, under a legal name


@pytest.mark.parametrize(
    ("key", "legal"),
    [
        ("otel.metric.overflow", "otel_metric_overflow"),
        ("capability", "capability"),
        ("9lives", "_9lives"),
        ("", "_"),
        ('a-b c\n"é', "a_b_c___"),
    ],
)
def test_label_names_are_made_legal(key: str, legal: str) -> None:
    assert label_name(key) == legal
    assert LABEL_NAME.fullmatch(label_name(key))


def test_an_aggregated_limit_record_counts_its_calls() -> None:
    metrics = _metrics()
    metrics.audit_committed(
        [
            _record("text.echo", "RATE_LIMITED", "count=1"),
            _record("", "RATE_LIMITED", "count=40 window_ms=1000"),
            _record("", "RATE_LIMITED", "count=23 window_ms=1000"),
        ],
        0.001,
    )
    text = metrics.prometheus_text()
    metrics.shutdown()
    assert 'capability="text.echo",decision="refuse",reason="RATE_LIMITED"} 1\n' in text
    assert 'capability="",decision="refuse",reason="RATE_LIMITED"} 63\n' in text


async def test_sixty_four_rate_limited_calls_count_sixty_four(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [{**grant("bob", ["text.echo"]), "max_calls_per_second": 0.0001, "burst": 1}],
    )
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"metrics": MetricsSettings(listen="127.0.0.1:0")}
    )
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    try:
        reasons: Counter[str] = Counter()
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            for _ in range(65):
                try:
                    await bob.invoke("text.echo", {"text": "hi"})
                    reasons["OK"] += 1
                except GatewayError as err:
                    reasons[err.reason] += 1
        agent.handler.limit_refusals.flush_all()
        await agent.audit.flush()
        text = agent.telemetry.metrics.prometheus_text()
    finally:
        await agent.stop()
    assert reasons == {"OK": 1, "RATE_LIMITED": 64}
    records = [r for r in audit_rows(config.audit_db) if r.reason == "RATE_LIMITED"]
    assert 1 < len(records) < 64  # aggregated: fewer records than calls
    counted = {
        (labels["capability"], labels["reason"]): float(line.rsplit(" ", 1)[1])
        for (name, labels), line in zip(samples(text), _sample_lines(text), strict=True)
        if name == "a2agw_decisions_total"
    }
    assert sum(n for (_, reason), n in counted.items() if reason == "RATE_LIMITED") == 64


def _sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]
