"""Task leases: at most one process runs a task at a time.

A process that runs (or resumes) a task first takes the task's lease in the task
store: an owner id and an expiry, renewed while the task runs. Another process
asking while the lease is live is refused (``TASK_LEASED``); an expired lease can
be taken over, and so can one whose holder is a process on this host that no
longer exists (a SIGKILL leaves its lease behind, and a restart should not have
to wait for it to expire).

Every checkpoint a running task writes is fenced by its lease: a process that
lost its lease cannot record a result, pin a write or change the state.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.local.process_owner import holder_gone

LEASE_SECONDS = 30.0
"""How long a lease lasts without renewal."""

RENEW_FRACTION = 1 / 3
"""A running task renews its lease after this fraction of ``LEASE_SECONDS``."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a task, and until when.

    Attributes:
        owner: The holder's id (``host:pid:nonce``).
        expires_unix_ms: Wall-clock time the lease ends unless renewed.
    """

    owner: str
    expires_unix_ms: int


def may_take(current: Lease | None, owner: str, now_ms: int) -> bool:
    """Whether ``owner`` may take a task whose lease is ``current`` at ``now_ms``."""
    return (
        current is None
        or current.owner == owner
        or current.expires_unix_ms <= now_ms
        or holder_gone(current.owner)
    )
