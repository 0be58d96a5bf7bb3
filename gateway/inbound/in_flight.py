"""The calls running now, one row each: for the operator on call.

Every admitted call is registered while :meth:`InvokeHandler.run
<gateway.inbound.invoke_handler.InvokeHandler.run>` runs it, whatever door it
came through: who called, which capability and version, over which binding,
for which task, since when, and the last progress its capability reported.

Invariants:

* Bounded: a row lives only while its call runs (at most the server's cap
  on calls), and keeps one progress text of at most :data:`PROGRESS_KEPT`
  characters, the latest.
* No payload: a row holds ids, names and the progress text the capability
  chose to send its watching caller (``ctx.report_progress``), nothing of the
  input or output. That text is the capability's choice and may say anything,
  so it is shown only where the audit decisions are (the operator console),
  never logged, exported or audited.
* The binding is what the transport said when it took the request
  (:func:`serving_binding`); a call that names none shows ``""``.

Everything here runs on the event loop thread: no locks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from capabilities.context import CallEvents

PROGRESS_KEPT = 200
"""Most characters of a progress report a row keeps (the rest is cut)."""

_BINDING: ContextVar[str] = ContextVar("a2agw_serving_binding", default="")


def serving_binding(name: str) -> None:
    """Say which binding the current request came through (its task and the tasks it starts).

    Called by each transport where it takes a request: ``"a2agw.v1 gRPC"``,
    ``"A2A gRPC"``, ``"A2A JSON-RPC"``, ``"A2A HTTP+JSON"``, ``"MCP"``.
    """
    _BINDING.set(name)


def current_binding() -> str:
    """The binding of the current request (``""`` if its transport named none)."""
    return _BINDING.get()


@dataclass(slots=True)
class RunningCall:
    """One call in flight (read-only to everyone but :class:`CallsInFlight`).

    Attributes:
        peer_id: The caller's SPIFFE ID.
        capability: The capability's name.
        version: The version serving it.
        binding: The binding it came through (``""``: not said).
        task_id: Its task (an A2A task, a plan's task), if any.
        request_id: The caller's request id.
        started: ``time.monotonic()`` when it started running.
        progress: The latest progress its capability reported (cut), if any.
        progress_at: ``time.monotonic()`` of that report (0.0: none).
    """

    peer_id: str
    capability: str
    version: str
    binding: str
    task_id: str
    request_id: str
    started: float
    progress: str = ""
    progress_at: float = 0.0


@dataclass(frozen=True, slots=True)
class InFlightCalls:
    """A snapshot of the calls in flight.

    Attributes:
        calls: One row each, the longest running first.
        now: The registry's clock at the snapshot (ages are ``now - started``).
    """

    calls: tuple[RunningCall, ...]
    now: float


class CallsInFlight:
    """The registry of calls running now (one per :class:`InvokeHandler`).

    Args:
        clock: Monotonic seconds (``time.monotonic`` unless a test injects one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._calls: dict[int, RunningCall] = {}
        self._keys = itertools.count()

    def start(
        self,
        peer_id: str,
        capability: str,
        version: str,
        *,
        task_id: str = "",
        request_id: str = "",
    ) -> tuple[int, RunningCall]:
        """Register a call that starts running now; its key (for :meth:`end`) and row."""
        key = next(self._keys)
        row = RunningCall(
            peer_id=peer_id,
            capability=capability,
            version=version,
            binding=current_binding(),
            task_id=task_id,
            request_id=request_id,
            started=self._clock(),
        )
        self._calls[key] = row
        return key, row

    def report(self, row: RunningCall, text: str) -> None:
        """Keep ``text`` as ``row``'s latest progress (cut to :data:`PROGRESS_KEPT`)."""
        row.progress = text[:PROGRESS_KEPT]
        row.progress_at = self._clock()

    def end(self, key: int) -> None:
        """The call with ``key`` ended (safe to call more than once)."""
        self._calls.pop(key, None)

    def snapshot(self) -> tuple[RunningCall, ...]:
        """Copies of the rows, the longest running first."""
        rows = [
            RunningCall(
                r.peer_id,
                r.capability,
                r.version,
                r.binding,
                r.task_id,
                r.request_id,
                r.started,
                r.progress,
                r.progress_at,
            )
            for r in self._calls.values()
        ]
        return tuple(sorted(rows, key=lambda r: r.started))

    def now(self) -> float:
        """The registry's clock, to turn ``started`` and ``progress_at`` into ages."""
        return self._clock()


class ProgressTap:
    """A call's events that also keep each progress report on its row.

    Wraps the events a watching caller gets (``ctx.report_progress``); every
    other member of :class:`CallEvents` is the wrapped one's, unchanged (so
    events this tap does not know of pass straight through).
    """

    def __init__(self, events: CallEvents, registry: CallsInFlight, row: RunningCall) -> None:
        self._events = events
        self._registry = registry
        self._row = row

    async def progress(self, text: str) -> None:
        """Keep ``text`` on the row, then send it to the watching caller."""
        self._registry.report(self._row, text)
        await self._events.progress(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._events, name)
