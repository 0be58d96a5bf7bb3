"""Live decisions: one audit feed polled for the whole console, fanned out to each open page.

The feed (``gateway.audit.follow``) reads only what committed after the last
poll, so a record appears once it is durable, never before. Each subscriber
has a bounded queue; one that falls behind (a stalled browser) loses its
stream rather than hold memory: the page reconnects and resumes (``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor

from gateway.audit.filter import AuditFilter
from gateway.audit.follow import AuditFeed
from gateway.audit.record import AuditRecord
from gateway.config import AgentConfig
from gateway.console.pages import utc
from gateway.display import printable
from gateway.errors import ConfigError
from gateway.runtime.stopping import cancel_and_wait
from gateway.storage import open_audit_feed, open_audit_reader

_log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
QUEUE_RECORDS = 1000


def event_data(rec: AuditRecord) -> str:
    """The JSON a page receives for one record: ids, names, sizes, codes (no detail, no payload)."""
    shown = {
        "time": utc(rec.time_unix_ms),
        "peer": rec.peer_id,
        "capability": rec.capability,
        "constraint": rec.version_constraint,
        "served": rec.served_version,
        "decision": rec.decision,
        "reason": rec.reason,
        "request_id": rec.request_id,
        "trace_id": rec.trace_id,
    }
    # Display strings, as the server-rendered rows show them (control and bidi visible).
    data: dict[str, object] = {key: printable(value) for key, value in shown.items()}
    data.update(seq=rec.seq, size=rec.payload_size, latency_ms=round(rec.latency_ms, 1))
    return json.dumps(data, sort_keys=True)


class LiveDecisions:
    """Polls the agent's audit log and hands each new record to every subscriber."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._subscribers: set[asyncio.Queue[AuditRecord | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._feed: AuditFeed | None = None
        # One thread owns the feed: a SQLite connection stays on the thread that opened it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="console-feed")

    async def start(self) -> None:
        """Open the feed at the log's current end and start polling (the log must exist)."""
        self._feed = await asyncio.get_running_loop().run_in_executor(
            self._thread, lambda: open_audit_feed(self._config.audit_db, self._where())
        )
        self._task = asyncio.create_task(self._run())

    def _where(self) -> AuditFilter:
        agent = self._config.id if open_audit_reader(self._config.audit_db).many_chains else None
        return AuditFilter(agent=agent)

    async def after(self, seq: int) -> list[AuditRecord]:
        """Committed records above ``seq``, oldest first: at most ``QUEUE_RECORDS``
        (a page that resumes from further back gets the rest when it reconnects).

        Raises:
            ConfigError: The store cannot be read.
        """

        def read() -> list[AuditRecord]:
            feed = open_audit_feed(self._config.audit_db, self._where(), after_seq=seq)
            try:
                return [entry.record for entry in feed.poll(most=QUEUE_RECORDS)][:QUEUE_RECORDS]
            finally:
                feed.close()

        return await asyncio.get_running_loop().run_in_executor(self._thread, read)

    async def stop(self) -> None:
        """Stop polling; every subscriber's stream ends."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._feed is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._feed.close)
            self._feed = None
        self._thread.shutdown(wait=False)
        for queue in list(self._subscribers):
            self._end(queue)

    def subscribe(self) -> asyncio.Queue[AuditRecord | None]:
        """A queue of records committed from now on; ``None`` in it ends the stream."""
        queue: asyncio.Queue[AuditRecord | None] = asyncio.Queue(QUEUE_RECORDS + 1)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[AuditRecord | None]) -> None:
        """Stop feeding ``queue``."""
        self._subscribers.discard(queue)

    def _end(self, queue: asyncio.Queue[AuditRecord | None]) -> None:
        self._subscribers.discard(queue)
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)

    async def _run(self) -> None:
        feed = self._feed
        assert feed is not None
        said = ""
        while True:
            try:
                entries = await asyncio.get_running_loop().run_in_executor(self._thread, feed.poll)
            except ConfigError as err:  # the store is away for now; the next poll retries
                if err.message != said:  # once per problem, not every POLL_SECONDS
                    _log.warning("console: audit log not readable: %s", err.message)
                said, entries = err.message, []
            else:
                said = ""
            for entry in entries:
                for queue in list(self._subscribers):
                    if queue.qsize() >= QUEUE_RECORDS:
                        self._end(queue)  # too slow: it reconnects and resumes
                    else:
                        queue.put_nowait(entry.record)
            await asyncio.sleep(POLL_SECONDS)
