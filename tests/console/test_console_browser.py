"""The console end to end in a real headless browser (Debian's chromium, driven by Playwright).

A test makes calls to a real agent over mTLS and watches them appear live on
the page (server-sent events), follows a record's trace link, opens the
refusals chart and the grants, and keeps a screenshot in its temp dir (the
CI artifact). Nothing is downloaded: chromium is the system's, installed by
``.ci/run``; the test skips only if it is absent.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.client.peer_client import PeerClient
from gateway.config import ConsoleSettings, TracingSettings
from gateway.errors import GatewayError
from gateway.runtime.agent import Agent
from tests.support import Pki, agent_config, grant, spiffe, started, write_policy

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} is not installed (Debian package chromium; .ci/run installs it)",
)


@pytest.fixture
async def console_agent(pki: Pki, tmp_path: Path) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = agent_config(pki, tmp_path, "alice", policy).model_copy(
        update={
            "console": ConsoleSettings(listen="127.0.0.1:0"),
            "tracing": TracingSettings(enabled=True),
        }
    )
    agent = await started(config)
    try:
        yield agent
    finally:
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


async def test_calls_appear_live_and_link_to_their_trace(
    console_agent: Agent, browser: Any, pki: Pki, tmp_path: Path
) -> None:
    console = console_agent.console
    assert console is not None
    page = await browser.new_page()
    requested: list[str] = []
    dialogs: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    answer = await page.goto(console.url + "/")
    assert answer is not None and answer.status == 200
    assert answer.headers["content-security-policy"].startswith("default-src 'self'")
    await page.wait_for_selector("#live-state.on", timeout=WAIT_MS)  # the stream is open
    assert await page.locator("#decision-rows tr").count() == 0

    hostile = "<img src=x onerror=alert(1)>"
    async with PeerClient(
        console_agent.config.id, console_agent.address, pki.material("bob")
    ) as bob:
        await bob.invoke("text.echo", {"text": "payload-never-shown"})
        for name in ("kv.get", hostile):
            with pytest.raises(GatewayError) as refused:
                await bob.invoke(name, {"key": "k"})
            assert refused.value.reason == "CAPABILITY_NOT_GRANTED"

    rows = page.locator("#decision-rows tr")
    await rows.nth(2).wait_for(timeout=WAIT_MS)  # (wait_for_function: the CSP forbids eval)
    assert await rows.count() == 3
    texts = [await rows.nth(i).inner_text() for i in range(3)]
    # Newest first, each as it committed: the two refusals, then the allowed call.
    assert hostile in texts[0] and "CAPABILITY_NOT_GRANTED" in texts[0]
    assert "kv.get" in texts[1] and "CAPABILITY_NOT_GRANTED" in texts[1]
    assert "text.echo" in texts[2] and "OK" in texts[2] and "1.0.0" in texts[2]
    assert all(spiffe("bob") in text for text in texts)
    assert "payload-never-shown" not in await page.content()
    assert await page.locator("img").count() == 0 and dialogs == []  # escaped, never markup
    await page.screenshot(path=str(tmp_path / "console-live.png"), full_page=True)
    assert (tmp_path / "console-live.png").stat().st_size > 0

    trace = rows.nth(1).locator("a.trace")
    trace_id = await trace.get_attribute("data-trace") or ""  # shown cut: the whole in its title
    assert len(trace_id) == 32
    await trace.click()
    await page.wait_for_url(f"**/?trace={trace_id}", timeout=WAIT_MS)
    traced = page.locator("#decision-rows tr")
    assert await traced.count() == 1
    assert "kv.get" in await traced.nth(0).inner_text()

    await page.goto(console.url + "/refusals")
    chart = page.locator("svg.chart")
    assert await chart.count() == 1
    assert "CAPABILITY_NOT_GRANTED" in (await chart.text_content() or "")
    totals = page.locator("main table tbody tr")
    assert await totals.count() == 1
    assert (await totals.nth(0).inner_text()).split("\t") == [
        spiffe("bob"),
        "CAPABILITY_NOT_GRANTED",
        "2",
    ]

    await page.goto(console.url + "/grants")
    grant_row = await page.locator("main table tbody tr").nth(0).inner_text()
    assert spiffe("bob") in grant_row and "text.echo" in grant_row
    await page.goto(console.url + "/certificate")
    assert spiffe("alice") in await page.locator("dl.facts").inner_text()
    await page.screenshot(path=str(tmp_path / "console-certificate.png"))

    assert requested and all(url.startswith(console.url + "/") for url in requested)
