"""The console as the operator on call reads it, in a real headless browser.

Calls run on three bindings at once (a2agw.v1 Invoke, A2A gRPC and A2A
JSON-RPC tasks that report progress): the in-flight page lists each with its
peer, capability, binding, task, age and progress, and empties when they end.
Every page fits a 1280 px wide window. The refusals chart has its axis and
baselines. The screenshots of docs/console.md are taken here: with
``A2AGW_UPDATE_SCREENSHOTS=1`` they are written to ``docs/images/`` (else to
the test's temp dir, so a run leaves the tree as it was).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.types import a2a_pb2_grpc

from capabilities.registry import CapabilityRegistry
from gateway.audit.record import AuditRecord
from gateway.client.peer_client import PeerClient
from gateway.config import ConsoleSettings
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH
from tests.a2a_http_support import V1_HEADERS, https_client, jsonrpc, message_params, serving_https
from tests.a2a_support import V1, data_request
from tests.console.test_console_browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    raw_channel,
    spiffe,
    standard_registry,
    started,
    write_policy,
)
from tests.task_capabilities import TaskGate

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} is not installed (Debian package chromium; .ci/run installs it)",
)

WIDTH = 1280
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
BOB, CAROL, DAVE = spiffe("bob"), spiffe("carol"), spiffe("dave")


@pytest.fixture
def gate() -> TaskGate:
    return TaskGate()


@pytest.fixture
async def on_call_agent(pki: Pki, tmp_path: Path, gate: TaskGate) -> AsyncIterator[Agent]:
    """alice on gRPC and HTTPS, with the task gate's capabilities and a console."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [
            {**grant("bob", ["text.echo", "job.run", "job.write"]), "max_calls_per_second": 50.0},
            grant("carol", ["text.echo", "job.run"]),
        ],
    )
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    registry: CapabilityRegistry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for capability in gate.capabilities():
        registry.register(capability)
    agent = await started(
        config.model_copy(update={"console": ConsoleSettings(listen="127.0.0.1:0")}), registry
    )
    try:
        yield agent
    finally:
        gate.release.set()
        await agent.stop()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


def screenshots(tmp_path: Path) -> Path:
    if os.environ.get("A2AGW_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(exist_ok=True)
        return DOCS_IMAGES
    return tmp_path


async def fits(page: Any) -> None:
    """Nothing on the page is wider than the window: no sideways scrolling."""
    for selector in ("header", "main form", "main table", "main svg", "main dl"):
        boxes = page.locator(selector)
        for i in range(await boxes.count()):
            box = await boxes.nth(i).bounding_box()
            assert box is not None and box["x"] + box["width"] <= WIDTH, (selector, box)


async def earlier_refusals(agent: Agent) -> None:
    """Refusals of the last hour, so the chart has a shape (written as the agent writes them)."""
    now_ms = int(time.time() * 1000)
    history = [
        (CAROL, "kv.put", "CAPABILITY_NOT_GRANTED", 52),
        (CAROL, "kv.put", "CAPABILITY_NOT_GRANTED", 51),
        (BOB, "text.echo", "RATE_LIMITED", 38),
        (BOB, "text.echo", "RATE_LIMITED", 37),
        (BOB, "text.echo", "RATE_LIMITED", 36),
        (DAVE, "text.echo", "GRANT_EXPIRED", 24),
        (CAROL, "kv.put", "CAPABILITY_NOT_GRANTED", 12),
    ]
    for peer, capability, reason, minutes_ago in history:
        await agent.audit.record_durable(
            AuditRecord(
                time_unix_ms=now_ms - minutes_ago * 60_000,
                request_id=os.urandom(8).hex() + "-1",
                peer_id=peer,
                capability=capability,
                version_constraint="",
                served_version="",
                decision="refuse",
                reason=reason,
                payload_size=24,
                payload_sha256="",
                latency_ms=0.3,
            )
        )


async def test_on_call_sees_every_call_in_flight_and_pages_fit_a_laptop(
    on_call_agent: Agent, browser: Any, pki: Pki, gate: TaskGate, tmp_path: Path
) -> None:
    agent = on_call_agent
    console = agent.console
    assert console is not None
    shots = screenshots(tmp_path)
    await earlier_refusals(agent)
    page = await browser.new_page(viewport={"width": WIDTH, "height": 800})
    bob = PeerClient(agent.config.id, agent.address, pki.material("bob"))
    carol = PeerClient(agent.config.id, agent.address, pki.material("carol"))
    await page.goto(console.url + "/")
    await page.wait_for_selector("#live-state.on", timeout=WAIT_MS)

    # Finished calls, allowed and refused, for the live table.
    await bob.invoke("text.echo", {"text": "payload-never-shown"}, constraint="^1")
    await carol.invoke("text.echo", {"text": "hello"})
    for caller, name in ((bob, "kv.get"), (carol, "kv.put")):
        with pytest.raises(GatewayError):
            await caller.invoke(name, {"key": "k", "value": "v"})

    # Three calls that run until released: a plain Invoke, and two A2A tasks followed in
    # the background (their capability reports progress to the task's watchers).
    write = asyncio.create_task(bob.invoke("job.write", {"tag": "w"}, timeout=60))
    channel = raw_channel(pki, agent, "carol")
    background = data_request("job.run", {"tag": "grpc"})
    background.configuration.return_immediately = True
    grpc_task = await a2a_pb2_grpc.A2AServiceStub(channel).SendMessage(background, metadata=V1)
    params = message_params("job.run", {"tag": "jsonrpc"})
    params["configuration"] = {"returnImmediately": True}
    async with https_client(pki, "bob", headers=V1_HEADERS) as web:
        answer = await web.post(agent.https_url + JSONRPC_PATH, json=jsonrpc("SendMessage", params))
    jsonrpc_task = answer.json()["result"]["task"]["id"]

    await page.goto(console.url + "/tasks")
    rows = page.locator("#in-flight-rows tr")
    for _ in range(100):  # bounded: both tasks report their progress as they start
        await page.reload()
        if await rows.count() == 3 and (await page.content()).count("halfway") == 2:
            break
        await asyncio.sleep(0.1)
    cells = [(await rows.nth(i).locator("td").all_inner_texts()) for i in range(await rows.count())]
    by_binding = {row[2]: row for row in cells}
    assert sorted(by_binding) == ["A2A JSON-RPC", "A2A gRPC", "a2agw.v1 gRPC"], cells
    invoke = by_binding["a2agw.v1 gRPC"]
    assert (invoke[0], invoke[1], invoke[3], invoke[5]) == (BOB, "job.write 1.0.0", "-", "-")
    assert by_binding["A2A gRPC"][:2] == [CAROL, "job.run 1.0.0"]
    assert by_binding["A2A JSON-RPC"][0] == BOB
    for binding, task_id in (("A2A gRPC", grpc_task.task.id), ("A2A JSON-RPC", jsonrpc_task)):
        start, end = by_binding[binding][3].split("…")  # cut in the middle, whole on hover
        assert task_id.startswith(start) and task_id.endswith(end)
        assert await page.locator(f'#in-flight-rows span[title="{task_id}"]').count() == 1
    for row in (by_binding["A2A gRPC"], by_binding["A2A JSON-RPC"]):
        assert row[5].startswith("halfway (") and row[5].endswith(" ago)"), row
        assert row[4].endswith(" s"), row  # how long it has run
    assert "payload-never-shown" not in await page.content()
    await fits(page)
    await page.set_viewport_size({"width": WIDTH, "height": 330})
    await page.screenshot(path=str(shots / "console-in-flight.png"), full_page=True)
    await page.set_viewport_size({"width": WIDTH, "height": 520})

    await page.goto(console.url + "/")
    await page.locator("#decision-rows tr").nth(3).wait_for(timeout=WAIT_MS)
    await fits(page)
    await page.screenshot(path=str(shots / "console-live.png"), full_page=True)

    await page.goto(console.url + "/refusals")
    chart = page.locator("svg.chart")
    labels = await chart.locator("text").all_text_contents()
    assert "now" in labels and "-1 h" in labels and "-30 min" in labels
    assert await chart.locator("line").count() >= 5  # a baseline per row, the axis, its ticks
    await fits(page)
    await page.screenshot(path=str(shots / "console-refusals.png"), full_page=True)

    for path in ("/grants", "/certificate", "/upstreams", "/audit"):
        await page.goto(console.url + path)
        await fits(page)

    gate.release.set()
    await write
    await page.goto(console.url + "/tasks")
    for _ in range(100):  # bounded: the two background tasks finish on their own
        if await page.locator("p.empty").count():
            break
        await asyncio.sleep(0.1)
        await page.reload()
    assert await page.locator("p.empty").inner_text() == "No call is running now."
    await channel.close()
    await bob.close()
    await carol.close()
