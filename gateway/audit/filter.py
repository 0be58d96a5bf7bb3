"""Which audit records a query or a feed wants: one value passed by every reader and caller."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from gateway.errors import ConfigError


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which records to hand out: each field given narrows the result (None: any).

    Attributes:
        agent: Only this agent's chain (a store of many chains; a SQLite file
            holds one agent and ignores it when querying).
        refusals_only: Only ``decision == "refuse"``.
        peer: Only this exact caller SPIFFE ID.
        capability: Only this exact capability name.
        trace_id: Only records of this trace (32 hex digits, any case).
        since: Only records at most this old (a feed starts this far back).
        limit: At most this many records, the most recent ones (queries only).
    """

    agent: str | None = None
    refusals_only: bool = False
    peer: str | None = None
    capability: str | None = None
    trace_id: str | None = None
    since: timedelta | None = None
    limit: int | None = None

    def check_limit(self) -> None:
        """Raises :class:`~gateway.errors.ConfigError` if ``limit`` is negative."""
        if self.limit is not None and self.limit < 0:
            raise ConfigError(f"audit query limit must be >= 0, not {self.limit}")

    def oldest_ms(self) -> int | None:
        """The earliest ``time_unix_ms`` wanted, from ``since`` and now (None: any)."""
        if self.since is None:
            return None
        return int((time.time() - self.since.total_seconds()) * 1000)

    def clauses(self, mark: str) -> tuple[list[str], list[object]]:
        """SQL conditions on peer, capability, trace and decision, and their
        parameters (``mark`` is the placeholder); ``agent``, ``since`` and
        ``limit`` are left to the store, which knows its columns and order."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (
            ("peer_id", self.peer),
            ("capability", self.capability),
            ("trace_id", self.trace_id.lower() if self.trace_id is not None else None),
        ):
            if value is not None:
                where.append(f"{column} = {mark}")
                params.append(value)
        if self.refusals_only:
            where.append("decision = 'refuse'")
        return where, params
