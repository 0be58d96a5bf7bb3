"""Services started in order on one ``AsyncExitStack`` and stopped in reverse.

An agent is its parts (:func:`gateway.runtime.compose.compose`, which does no
I/O) and an ordered list of services over them
(:func:`gateway.runtime.services.agent_services`). A service has a ``start``
and a ``stop``; :class:`ServiceStack` starts them one at a time and pushes
each started one's ``stop`` onto one :class:`contextlib.AsyncExitStack`, so:

* a start that fails stops every service started before it, in reverse, and
  its own error propagates: a ``stop`` that fails while unwinding is logged,
  never raised in its place;
* a graceful stop runs every ``stop`` in reverse start order, each one even
  when one before it failed, and then raises the first failure;
* a service whose ``start`` fails has nothing to stop: a start either
  succeeds or leaves nothing running, so its ``stop`` is never called.

This is the order uvicorn and temporal's worker keep (start the parts in
order, stop them in reverse); a new subsystem is one more entry in a list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.runtime.stopping import cancel_and_wait

_log = logging.getLogger(__name__)


class Service(Protocol):
    """One thing an agent starts and stops (a server, a writer thread, a watcher)."""

    @property
    def name(self) -> str:
        """What it is, for logs and tests (``"gRPC server"``)."""
        ...

    async def start(self) -> None:
        """Start; on failure, leave nothing running (``stop`` will not be called)."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop; ``grace``: seconds calls in flight may take to finish."""
        ...


@dataclass(frozen=True, slots=True)
class Step:
    """A service made of two callables; a missing one has nothing to do.

    A step with only ``on_stop`` marks a moment in the stop order (drain the
    A2A runs while the servers still carry their streams); one with only
    ``on_start`` a moment in the start order (reload the replay window before
    the server takes calls).
    """

    name: str
    """What it is, for logs and tests."""
    on_start: Callable[[], Awaitable[object]] | None = None
    """What starting does."""
    on_stop: Callable[[float], Awaitable[object]] | None = None
    """What stopping does, given the grace in seconds."""

    async def start(self) -> None:
        """Run ``on_start``."""
        if self.on_start is not None:
            await self.on_start()

    async def stop(self, grace: float) -> None:
        """Run ``on_stop``."""
        if self.on_stop is not None:
            await self.on_stop(grace)


class BackgroundLoop:
    """A service that runs ``body()`` as a task from start until stop cancels it."""

    def __init__(self, name: str, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        """What it is, for logs and tests."""
        self._body = body
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the task."""
        self._task = asyncio.get_running_loop().create_task(self._body(), name=self.name)

    async def stop(self, grace: float) -> None:
        """Cancel the task and wait until it has ended."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)


class ServiceStack:
    """The services started so far, stopped in reverse by :meth:`stop`."""

    def __init__(self, *, unwind_grace: float = 0.0) -> None:
        """``unwind_grace``: the grace each ``stop`` gets when a failed start unwinds."""
        self._exits = contextlib.AsyncExitStack()
        self._unwind_grace = unwind_grace
        self._grace = unwind_grace
        self._names: list[str] = []
        self._failures: list[Exception] = []

    @property
    def names(self) -> tuple[str, ...]:
        """The services whose ``stop`` is pending, in start order."""
        return tuple(self._names)

    async def enter(self, service: Service) -> None:
        """Start ``service``; its ``stop`` runs when the stack stops or unwinds."""
        await service.start()
        self.adopt(service)

    async def enter_all(self, services: Iterable[Service]) -> None:
        """Start each of ``services`` in order (see :meth:`starting` for a failure)."""
        for service in services:
            await self.enter(service)

    def adopt(self, service: Service) -> None:
        """Have ``service`` stopped with the others without starting it here (it has
        nothing to start, or its owner starts it); ``stop`` is safe on a part never started."""
        self._exits.push_async_callback(self._stop, service)
        self._names.append(service.name)

    @contextlib.asynccontextmanager
    async def starting(self) -> AsyncIterator[ServiceStack]:
        """Within this block, an error stops what was started, in reverse, and propagates.

        A ``stop`` that fails meanwhile is logged: the start's own error is the one raised.
        """
        try:
            yield self
        except BaseException:
            self._grace = self._unwind_grace
            await self._close()
            self._failures.clear()
            raise

    async def stop(self, grace: float) -> None:
        """Stop every service in reverse start order (nothing if none is pending).

        Raises:
            Exception: the first error a ``stop`` raised, after every ``stop`` has run.
        """
        self._grace = grace
        await self._close()
        failures, self._failures = self._failures, []
        if failures:
            raise failures[0]

    async def _close(self) -> None:
        try:
            await self._exits.aclose()
        finally:
            self._names.clear()

    async def _stop(self, service: Service) -> None:
        try:
            await service.stop(self._grace)
        except Exception as err:
            _log.error("stopping the %s failed: %s", service.name, err, exc_info=err)
            self._failures.append(err)
        finally:
            self._names.pop()  # the stack runs the stops last in, first out
