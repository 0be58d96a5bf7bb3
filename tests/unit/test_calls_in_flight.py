"""The registry of calls in flight: a row per running call, bounded, no payload."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from gateway.inbound.in_flight import (
    PROGRESS_KEPT,
    CallsInFlight,
    ProgressTap,
    current_binding,
    serving_binding,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Watcher:
    """A watching caller's events (progress, chunks) as the servicer gives them."""

    def __init__(self) -> None:
        self.progress_seen: list[str] = []
        self.chunks: list[dict[str, Any]] = []

    async def progress(self, text: str) -> None:
        self.progress_seen.append(text)

    async def chunk(self, data: dict[str, Any]) -> None:
        self.chunks.append(data)


def test_a_row_lives_while_its_call_runs_and_says_how_long() -> None:
    clock = Clock()
    registry = CallsInFlight(clock)
    first, _ = registry.start("spiffe://example.org/agent/bob", "job.run", "1.0.0", task_id="t1")
    clock.now += 5
    second, _ = registry.start("spiffe://example.org/agent/carol", "text.echo", "1.2.0")
    clock.now += 1
    rows = registry.snapshot()
    assert [(r.peer_id, r.capability, r.task_id) for r in rows] == [
        ("spiffe://example.org/agent/bob", "job.run", "t1"),  # the longest running first
        ("spiffe://example.org/agent/carol", "text.echo", ""),
    ]
    assert [registry.now() - r.started for r in rows] == [6.0, 1.0]
    registry.end(first)
    registry.end(first)  # twice: no harm
    assert [r.capability for r in registry.snapshot()] == ["text.echo"]
    registry.end(second)
    assert registry.snapshot() == ()


def test_the_binding_is_the_one_its_request_named() -> None:
    registry = CallsInFlight()

    def served(name: str) -> str:
        serving_binding(name)
        _, row = registry.start("spiffe://example.org/agent/bob", "text.echo", "1.0.0")
        return row.binding

    assert served_in_fresh_context(served, "A2A JSON-RPC") == "A2A JSON-RPC"
    assert served_in_fresh_context(served, "a2agw.v1 gRPC") == "a2agw.v1 gRPC"
    assert current_binding() == ""  # each request's own context: nothing leaks out


def served_in_fresh_context(served: Any, name: str) -> str:
    result: str = contextvars.Context().run(served, name)
    return result


def test_progress_is_kept_cut_and_passed_on_and_the_rest_goes_through() -> None:
    clock = Clock()
    registry = CallsInFlight(clock)
    _, row = registry.start("spiffe://example.org/agent/bob", "job.run", "1.0.0")
    watcher = Watcher()
    tap = ProgressTap(watcher, registry, row)
    clock.now += 2
    long_text = "x" * (PROGRESS_KEPT + 50)
    asyncio.run(tap.progress("halfway"))
    assert (row.progress, row.progress_at) == ("halfway", 102.0)
    asyncio.run(tap.progress(long_text))
    asyncio.run(tap.chunk({"part": 1}))  # not the tap's: straight to the watcher
    assert row.progress == "x" * PROGRESS_KEPT
    assert watcher.progress_seen == ["halfway", long_text]  # the caller gets it whole
    assert watcher.chunks == [{"part": 1}]
    assert registry.snapshot()[0].progress == "x" * PROGRESS_KEPT
