"""The truth behind the gRPC health service: SERVING only while every check passes.

Checks are plain callables (audit log healthy, a live policy). The monitor
re-evaluates them when poked (thread-safe: the audit writer thread pokes it
on each health change) and on a short poll (grants expire with time alone).
Shutdown is final: once the server enters it, the status stays NOT_SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from gateway.runtime.stopping import cancel_and_wait

_log = logging.getLogger(__name__)

Check = Callable[[], bool]
"""True while the agent can serve as far as this check knows."""


class HealthMonitor:
    """Keeps the health service's status equal to the conjunction of ``checks``.

    Attributes:
        serving: The status last published.
        failing: Names of the checks that failed at the last evaluation.
    """

    def __init__(
        self,
        checks: Mapping[str, Check],
        publish: Callable[[bool], Awaitable[None]],
        *,
        poll_seconds: float = 1.0,
    ) -> None:
        self._checks = dict(checks)
        self._publish = publish
        self._poll = poll_seconds
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.serving = True
        self.failing: tuple[str, ...] = ()

    def start(self) -> None:
        """Start watching (from the event loop the server runs on)."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop watching (the last published status stays)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def poke(self) -> None:
        """Re-evaluate now; callable from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._wake.set)

    async def evaluate(self) -> bool:
        """Run the checks and publish the result if it changed; returns it."""
        failing = tuple(name for name, check in self._checks.items() if not check())
        serving = not failing
        if serving != self.serving or failing != self.failing:
            if serving:
                _log.warning("health: SERVING again")
            else:
                _log.error("health: NOT_SERVING (%s)", ", ".join(failing))
        if serving != self.serving:
            await self._publish(serving)
        self.serving, self.failing = serving, failing
        return serving

    async def _run(self) -> None:
        while True:
            try:
                await self.evaluate()
            except Exception:  # a broken check must not stop the monitor
                _log.exception("health: a check failed to run")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll):
                    await self._wake.wait()
