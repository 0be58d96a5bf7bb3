"""``/healthz`` and ``/readyz`` over plain HTTP, for orchestrators without a client certificate.

They tell the truth of the gRPC health service (``gateway.server.health``),
read from the same state at request time:

- ``/readyz``: ``200 SERVING`` exactly while gRPC health says SERVING (the
  agent has started, every health check passes, shutdown has not begun);
  otherwise ``503 NOT_SERVING: <why>`` naming the failing checks (``audit
  log``, ``policy``), ``starting`` or ``shutting down``.
- ``/healthz``: ``200 ok`` while the process runs its event loop and has not
  begun to stop (a failing audit log makes the agent not ready, not dead:
  restarting it would not bring the disk back).

Served by the ``[metrics]`` listener and the console listener (loopback
unless their ``allow_remote`` is set). The bodies hold check names only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class HealthState:
    """What the agent's health is right now.

    Attributes:
        started: The gRPC server is up and publishing health.
        stopping: Shutdown has begun (final).
        failing: Names of the health checks failing now (empty: all pass).
    """

    started: bool
    stopping: bool
    failing: tuple[str, ...] = ()

    @property
    def serving(self) -> bool:
        """What the gRPC health service says: SERVING (True) or NOT_SERVING."""
        return self.started and not self.stopping and not self.failing

    def why_not(self) -> str:
        """Why the agent is not serving (``""`` when it is)."""
        if self.stopping:
            return "shutting down"
        if not self.started:
            return "starting"
        return ", ".join(self.failing)


HealthSource = Callable[[], HealthState]
"""Reads the agent's health state (called on the event loop, per request)."""


def health_answer(path: str, source: HealthSource) -> tuple[str, str]:
    """Status line and body for ``GET path`` (``path`` in :data:`HEALTH_PATHS`)."""
    state = source()
    if path == "/healthz":
        return (
            ("200 OK", "ok\n") if not state.stopping else ("503 Service Unavailable", "stopping\n")
        )
    if state.serving:
        return "200 OK", "SERVING\n"
    return "503 Service Unavailable", f"NOT_SERVING: {state.why_not()}\n"
