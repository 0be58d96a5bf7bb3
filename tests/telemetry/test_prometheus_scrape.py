"""A real Prometheus server scrapes a real agent: its counts equal the calls and the audit log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import MetricsSettings
from gateway.errors import CapabilityNotGranted, UnknownPeer
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    standard_registry,
    write_policy,
)

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus binary is not installed (Debian package prometheus)",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _prometheus(tmp_path: Path, target: str) -> Iterator[str]:
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: agent\n    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    address = f"127.0.0.1:{_free_port()}"
    assert PROMETHEUS is not None
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={address}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    try:
        yield address
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _query(address: str, promql: str) -> list[dict[str, Any]]:
    url = f"http://{address}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as answer:  # loopback only
        body = json.load(answer)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


async def _scraped_after(address: str, promql: str, moment: float) -> list[dict[str, Any]]:
    """The query's result from a scrape that started after ``moment`` (bounded wait)."""
    for _ in range(120):  # at most ~60 s on a loaded machine
        with contextlib.suppress(OSError):
            result = await asyncio.to_thread(_query, address, promql)
            if result and all(float(series["value"][0]) > moment for series in result):
                return result
        await asyncio.sleep(0.5)
    raise AssertionError(f"Prometheus never scraped {promql} after the calls")


async def test_prometheus_counts_equal_the_calls_and_the_audit_log(
    pki: Pki, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo@^1"])])
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"metrics": MetricsSettings(listen="127.0.0.1:0")}
    )
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    try:
        assert agent.telemetry.metrics_address is not None
        bob = PeerClient(agent.config.id, agent.address, pki.material("bob"))
        dave = PeerClient(agent.config.id, agent.address, pki.material("dave"))
        for n in range(5):
            await bob.invoke("text.echo", {"text": f"hi {n}"})
        for _ in range(3):
            with pytest.raises(CapabilityNotGranted):
                await bob.invoke("kv.get", {"key": "k"})
        for _ in range(2):
            with pytest.raises(UnknownPeer):
                await dave.invoke("text.echo", {"text": "hi"})
        await bob.close()
        await dave.close()
        await agent.audit.flush()
        done = time.time()

        with _prometheus(tmp_path, agent.telemetry.metrics_address) as prometheus:
            result = await _scraped_after(prometheus, "a2agw_decisions_total", done)
            in_flight = await _scraped_after(prometheus, "sum(a2agw_calls_in_flight)", done)
            durations = await _scraped_after(prometheus, "a2agw_call_duration_seconds_count", done)
    finally:
        await agent.stop()

    counted = {
        (s["metric"]["capability"], s["metric"]["decision"], s["metric"]["reason"]): int(
            float(s["value"][1])
        )
        for s in result
    }
    assert counted == {
        ("text.echo", "allow", "OK"): 5,
        ("kv.get", "refuse", "CAPABILITY_NOT_GRANTED"): 3,
        ("text.echo", "refuse", "UNKNOWN_PEER"): 2,
    }
    audited = Counter((r.capability, r.decision, r.reason) for r in audit_rows(config.audit_db))
    assert counted == dict(audited)
    assert all("peer" not in s["metric"] for s in result)  # peer labels are off by default
    assert float(in_flight[0]["value"][1]) == 0
    assert {
        (s["metric"]["capability"], s["metric"]["decision"]): int(float(s["value"][1]))
        for s in durations
    } == {("text.echo", "allow"): 5, ("kv.get", "refuse"): 3, ("text.echo", "refuse"): 2}


async def test_thousands_of_invented_capability_names_keep_the_scrape_valid(
    pki: Pki, tmp_path: Path
) -> None:
    names = 2_100  # above the metrics SDK's default cardinality limit (2,000)
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo@^1"])])
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={"metrics": MetricsSettings(listen="127.0.0.1:0")}
    )
    agent = Agent(config, standard_registry(WriteCounter(), tmp_path / "alice-state"))
    await agent.start(watch_policy=False)
    try:
        assert agent.telemetry.metrics_address is not None
        gate = asyncio.Semaphore(16)

        async def invent(dave: PeerClient, n: int) -> str:
            async with gate:
                try:
                    await dave.invoke(f"invented.{n}", {"text": "hi"})
                except UnknownPeer as err:  # dave holds no grant
                    return err.reason
            return "OK"

        async with PeerClient(agent.config.id, agent.address, pki.material("dave")) as dave:
            reasons = await asyncio.gather(*(invent(dave, n) for n in range(names)))
        assert set(reasons) == {"UNKNOWN_PEER"}
        await agent.audit.flush()
        done = time.time()

        with _prometheus(tmp_path, agent.telemetry.metrics_address) as prometheus:
            up = await _scraped_after(prometheus, 'up{job="agent"}', done)
            result = await _scraped_after(prometheus, "a2agw_decisions_total", done)
    finally:
        await agent.stop()

    assert float(up[0]["value"][1]) == 1  # the scrape was accepted
    assert {
        (s["metric"]["capability"], s["metric"]["reason"]): int(float(s["value"][1]))
        for s in result
    } == {("_other", "UNKNOWN_PEER"): names}
