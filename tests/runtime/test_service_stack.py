"""The service stack: start in order, stop in reverse, a failed start undone, its error kept."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.errors import AddressUnavailable, AuditUnavailable
from gateway.runtime.service_stack import BackgroundLoop, ServiceStack, Step


class Fake:
    """A service that writes what happens to it into ``events``, failing where told."""

    def __init__(
        self,
        name: str,
        events: list[str],
        *,
        fail_start: BaseException | None = None,
        fail_stop: Exception | None = None,
    ) -> None:
        self.name = name
        self._events = events
        self._fail_start = fail_start
        self._fail_stop = fail_stop

    async def start(self) -> None:
        if self._fail_start is not None:
            self._events.append(f"start {self.name} failed")
            raise self._fail_start
        self._events.append(f"start {self.name}")

    async def stop(self, grace: float) -> None:
        self._events.append(f"stop {self.name} grace={grace:g}")
        if self._fail_stop is not None:
            raise self._fail_stop


async def test_services_start_in_order_and_stop_in_reverse() -> None:
    events: list[str] = []
    stack = ServiceStack()
    async with stack.starting():
        await stack.enter_all(Fake(name, events) for name in ("audit", "grpc", "https"))
    assert stack.names == ("audit", "grpc", "https")
    await stack.stop(grace=3)
    assert events == [
        "start audit",
        "start grpc",
        "start https",
        "stop https grace=3",
        "stop grpc grace=3",
        "stop audit grace=3",
    ]
    assert stack.names == ()
    await stack.stop(grace=3)  # nothing left: nothing happens
    assert len(events) == 6


async def test_a_failed_start_stops_what_started_in_reverse_and_raises_its_own_error() -> None:
    events: list[str] = []
    taken = AddressUnavailable("could not listen on 127.0.0.1:1 for A2A over HTTPS")
    stack = ServiceStack(unwind_grace=0.5)
    services = [
        Fake("audit", events),
        Fake("grpc", events),
        Fake("https", events, fail_start=taken),
        Fake("console", events),
    ]
    with pytest.raises(AddressUnavailable) as raised:
        async with stack.starting():
            await stack.enter_all(services)
    assert raised.value is taken
    assert events == [
        "start audit",
        "start grpc",
        "start https failed",  # never started: never stopped
        "stop grpc grace=0.5",
        "stop audit grace=0.5",
    ]
    assert stack.names == ()


async def test_an_error_of_a_stop_while_unwinding_is_logged_and_never_masks_the_start_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[str] = []
    closing = AuditUnavailable("audit log: final commit failed")
    taken = AddressUnavailable("listen 127.0.0.1:1: cannot bind")
    stack = ServiceStack()
    with caplog.at_level(logging.ERROR, logger="gateway.runtime.service_stack"):
        with pytest.raises(AddressUnavailable) as raised:
            async with stack.starting():
                await stack.enter(Fake("audit", events, fail_stop=closing))
                await stack.enter(Fake("stores", events, fail_stop=RuntimeError("disk gone")))
                await stack.enter(Fake("grpc", events, fail_start=taken))
    assert raised.value is taken
    assert events == [
        "start audit",
        "start stores",
        "start grpc failed",
        "stop stores grace=0",
        "stop audit grace=0",  # still stopped after the stores' stop failed
    ]
    assert [r.getMessage() for r in caplog.records] == [
        "stopping the stores failed: disk gone",
        "stopping the audit failed: AUDIT_UNAVAILABLE: audit log: final commit failed",
    ]
    # The failures of the unwinding are not kept for a later stop to raise.
    await stack.stop(grace=0)


async def test_an_error_outside_any_start_unwinds_too() -> None:
    events: list[str] = []
    stack = ServiceStack()
    with pytest.raises(ValueError, match="compose failed"):
        async with stack.starting():
            await stack.enter(Fake("stores", events))
            raise ValueError("compose failed")
    assert events == ["start stores", "stop stores grace=0"]


async def test_a_cancelled_start_unwinds_and_stays_cancelled() -> None:
    events: list[str] = []
    stack = ServiceStack()
    entered = asyncio.Event()

    class Hangs(Fake):
        async def start(self) -> None:
            entered.set()
            await asyncio.Event().wait()

    async def start() -> None:
        async with stack.starting():
            await stack.enter(Fake("audit", events))
            await stack.enter(Hangs("grpc", events))

    task = asyncio.get_running_loop().create_task(start())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["start audit", "stop audit grace=0"]


async def test_a_graceful_stop_runs_every_stop_and_then_raises_the_first_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[str] = []
    first, second = RuntimeError("https would not stop"), RuntimeError("grpc would not stop")
    stack = ServiceStack()
    async with stack.starting():
        await stack.enter(Fake("audit", events))
        await stack.enter(Fake("grpc", events, fail_stop=second))
        await stack.enter(Fake("https", events, fail_stop=first))
    with caplog.at_level(logging.ERROR, logger="gateway.runtime.service_stack"):
        with pytest.raises(RuntimeError) as raised:
            await stack.stop(grace=1)
    assert raised.value is first
    assert events[3:] == ["stop https grace=1", "stop grpc grace=1", "stop audit grace=1"]
    assert len(caplog.records) == 2


async def test_an_adopted_service_is_stopped_but_never_started() -> None:
    events: list[str] = []
    stack = ServiceStack()
    async with stack.starting():
        await stack.enter(Fake("stores", events))
        stack.adopt(Fake("audit", events))  # its owner starts it (or it has nothing to start)
    await stack.stop(grace=0)
    assert events == ["start stores", "stop audit grace=0", "stop stores grace=0"]


async def test_a_step_runs_its_callables_and_a_missing_one_does_nothing() -> None:
    events: list[str] = []

    async def drain(grace: float) -> None:
        events.append(f"drained within {grace:g}s")

    async def invalidate() -> None:
        events.append("card invalidated")

    stack = ServiceStack()
    async with stack.starting():
        await stack.enter(Step("calls in flight", on_stop=drain))
        await stack.enter(Step("card", on_start=invalidate))
    await stack.stop(grace=2)
    assert events == ["card invalidated", "drained within 2s"]


async def test_a_background_loop_runs_until_its_stop_cancels_it() -> None:
    rounds: list[int] = []
    running, cancelled = asyncio.Event(), asyncio.Event()

    async def body() -> None:
        try:
            while True:
                rounds.append(len(rounds))
                if len(rounds) == 3:
                    running.set()
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    loop = BackgroundLoop("purge loop", body)
    stack = ServiceStack()
    async with stack.starting():
        await stack.enter(loop)
    await running.wait()
    await stack.stop(grace=0)
    assert cancelled.is_set()
    count = len(rounds)
    await asyncio.sleep(0)
    assert len(rounds) == count  # ended for good
