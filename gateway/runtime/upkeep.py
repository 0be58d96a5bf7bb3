"""The agent's state upkeep: the replay window reloaded at start, purges, refusal flushes."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from gateway.config import AgentConfig
from gateway.errors import AuditUnavailable, StateUnavailable, reasons_where
from gateway.inbound.idempotency.store import IdempotencyStore
from gateway.inbound.limits.refusal_log import DEFAULT_INTERVAL_SECONDS, LimitRefusalLog
from gateway.inbound.replay.store import ReplayWindow
from gateway.storage import open_audit_reader

_log = logging.getLogger(__name__)

PURGE_EVERY_SECONDS = 3600.0
"""How often completed idempotency keys past their retention are purged."""


def remember_recent_request_ids(config: AgentConfig, replay: ReplayWindow) -> None:
    """Reload the window's request ids from the audit log (blocking: run it in a thread).

    A restart must not reopen the replay window: the ids of the calls that got
    past the policy (the ones the window records) come back from the log. A
    window shared by workers outlives the process and needs none.
    """
    if replay.shared:
        return
    window = replay.window_seconds
    now_ms = time.time() * 1000
    recent = open_audit_reader(config.audit_db).recent_request_ids(
        agent=config.id,
        since=timedelta(seconds=window),
        limit=replay.max_entries,
        refusals=reasons_where("spends_request_id"),
    )
    replay.preload(
        (peer_id, request_id, (now_ms - time_unix_ms) / 1000)
        for peer_id, request_id, time_unix_ms in recent
    )


async def purge_completed_keys(config: AgentConfig, idempotency: IdempotencyStore) -> None:
    """Purge the completed idempotency keys older than ``idempotency_retention``.

    Raises:
        StateUnavailable: the store could not be purged.
    """
    retention = config.idempotency_retention
    purged = await idempotency.purge_completed(retention)
    if purged:
        _log.info("purged %d completed idempotency key(s) older than %s", purged, retention)


async def purge_periodically(config: AgentConfig, idempotency: IdempotencyStore) -> None:
    """Purge every ``PURGE_EVERY_SECONDS`` until cancelled; a failed round is logged."""
    while True:
        await asyncio.sleep(PURGE_EVERY_SECONDS)
        try:
            await purge_completed_keys(config, idempotency)
        except StateUnavailable as err:  # the next round tries again; calls are unaffected
            _log.warning("idempotency purge failed: %s", err.message)


async def flush_refusals_periodically(refusals: LimitRefusalLog) -> None:
    """Write the aggregated limit refusals of ended intervals until cancelled."""
    while True:
        await asyncio.sleep(DEFAULT_INTERVAL_SECONDS)
        try:
            refusals.flush_expired()
        except AuditUnavailable as err:  # the counts stay pending; the next round retries
            _log.warning("aggregated limit refusals not written yet: %s", err.message)


def flush_all_refusals(refusals: LimitRefusalLog) -> None:
    """At stop: every counted refusal reaches the log before it closes (a failure is logged)."""
    try:
        refusals.flush_all()
    except AuditUnavailable as err:
        _log.error("could not write aggregated limit refusals: %s", err.message)
