"""The append-only audit log: a cheap hot path in front of one batching writer thread.

``record()`` only puts the record on a queue. A dedicated thread takes
everything queued (up to ``max_batch``), hashes and stores it in one SQLite
transaction, commits, then wakes the callers waiting for that batch. A
refusal therefore becomes durable before the caller sees it, while many
concurrent refusals share one commit.

If a commit fails the log fails closed: waiters and every later call get
:class:`~gateway.errors.AuditUnavailable`, and ``healthy`` turns False. A
PostgreSQL database that went away is reconnected to with backoff (and probed
while idle, so health turns before the next call); a SQLite file is reopened
every ``retry_seconds`` when that is set. Either way, once a write succeeds
(and the chain head is where it was) the log accepts records again and
``healthy`` turns True. Records nobody waited on belong to calls that were
already answered: when their commit fails they are kept, and committed first
when the store can write again (or tried once more at close); a refusal whose
caller was told AUDIT_UNAVAILABLE is not written later. Health listeners hear
of both transitions; an observer hears of every committed batch.

With a :class:`~gateway.audit.checkpoint.Checkpointer` the same thread also
writes signed checkpoints of the chain head, only ever after the records they
cover are committed; a checkpoint that cannot be written fails the log closed
too (the tail would no longer be protected).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Protocol

from gateway.audit.checkpoint import Checkpointer
from gateway.audit.record import AuditRecord, checked_fields
from gateway.audit.store.store import ChainWriter
from gateway.errors import AuditUnavailable, ConfigError

_log = logging.getLogger(__name__)


class _Stop:
    """Queued by close(): write what is before it, then end the writer thread."""


_STOP = _Stop()
_Waiter = asyncio.Future[None]
_Item = tuple[AuditRecord | None, _Waiter | None] | _Stop
_ErrorFactory = Callable[[], BaseException]
_FIRST_RETRY_SECONDS = 0.2
_MAX_RETRY_SECONDS = 5.0
_PROBE_SECONDS = 2.0


class AuditObserver(Protocol):
    """Told of every committed batch, from the writer thread (keep it cheap)."""

    def audit_committed(self, records: Sequence[Mapping[str, object]], seconds: float) -> None:
        """``records`` (as stored, with their seqs) were committed in ``seconds``."""


HealthListener = Callable[[bool], None]
"""Called with the new ``healthy`` value on each transition (from any thread)."""


class _State(Enum):
    NEW = "new"
    OPEN = "open"
    FAILED = "failed"
    CLOSED = "closed"


class AuditLog:
    """Tamper-evident, append-only audit log: one SQLite (WAL) file, or one agent's
    chain in a shared PostgreSQL database.

    Attributes:
        batches_committed: Transactions committed so far (one per batch).
    """

    def __init__(
        self,
        writer: ChainWriter,
        *,
        max_batch: int = 512,
        linger_ms: float = 10.0,
        checkpoints: Checkpointer | None = None,
        retry_seconds: float | None = None,
        observer: AuditObserver | None = None,
    ) -> None:
        """Prepare a log; nothing is opened until :meth:`start`.

        Args:
            writer: The store of the chain, not opened yet (opened at
                :meth:`start`): the storage factory's ``open_chain_writer``
                gives one for a SQLite file (created if missing) or one
                agent's chain in PostgreSQL (schema migrated at start), and
                takes the store's own settings (lock wait, ``synchronous``).
            max_batch: Most records committed in one transaction.
            linger_ms: How long a batch that nobody waits on (allowed calls only)
                may wait for more records, so many share one commit. A durable
                record ends the wait at once.
            checkpoints: Writes signed checkpoints of the chain head outside
                the database (None: none are written).
            retry_seconds: After a failed commit, try to reopen this often
                (None: stay failed until restarted).
            observer: Told of each committed batch (metrics).

        Raises:
            ConfigError: ``max_batch`` < 1.
        """
        if max_batch < 1:
            raise ConfigError(f"audit max_batch must be at least 1, not {max_batch}")
        self._max_batch = max_batch
        self._linger = max(0.0, linger_ms) / 1000.0
        self._writer = writer
        self._retry_in = _FIRST_RETRY_SECONDS
        self._checkpoints = checkpoints
        self._unwritten: list[dict[str, object]] = []
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._urgent = threading.Event()
        self._state = _State.NEW
        # One flag read on the hot path instead of a state comparison.
        self._accepting = False
        self._why = f"{self._writer.where}: not started"
        self._cause: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._retry = retry_seconds
        self._recoverable = False
        self._observer = observer
        self._listeners: list[HealthListener] = []
        self.batches_committed = 0

    def add_health_listener(self, listener: HealthListener) -> None:
        """Call ``listener(healthy)`` on every change of :attr:`healthy` (from any thread)."""
        self._listeners.append(listener)

    @property
    def queue_depth(self) -> int:
        """Records (and flushes) queued but not yet committed (approximate)."""
        return self._queue.qsize()

    @property
    def where(self) -> str:
        """The store of this log as shown in messages (a file, or a redacted DSN)."""
        return self._writer.where

    @property
    def healthy(self) -> bool:
        """True while the log is open and every commit so far has succeeded."""
        return self._accepting

    async def start(self) -> None:
        """Open the database (creating the schema) and start the writer thread.

        Raises:
            AuditUnavailable: The file cannot be opened for writing (the message
                names the path and why), or the log was already started.
        """
        if self._state is not _State.NEW:
            raise AuditUnavailable(f"{self._writer.where}: already started")
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        self._stopped = loop.create_future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(opened, self._stopped), name="audit-writer", daemon=True
        )
        self._thread.start()
        try:
            await opened
        except ConfigError:
            self._state = _State.FAILED
            raise
        except AuditUnavailable as err:
            self._state, self._why, self._cause = _State.FAILED, err.message, err.__cause__
            raise
        self._state, self._accepting = _State.OPEN, True
        self._tell(True)

    async def close(self) -> None:
        """Commit everything queued, stop the writer thread and close the database.

        Idempotent. A failure of the final commit is logged (and ``healthy``
        stays False) rather than raised: the caller is shutting down anyway.
        """
        was_healthy, self._accepting = self._accepting, False
        if was_healthy:
            self._tell(False)
        if self._state in (_State.NEW, _State.OPEN):
            self._state, self._why = _State.CLOSED, f"{self._writer.where}: closed"
        if self._stopped is None or self._stopped.done():
            return
        self._queue.put(_STOP)
        self._urgent.set()
        await self._stopped

    def record(self, rec: AuditRecord) -> None:
        """Queue ``rec``; it is committed with the next batch.

        Raises:
            AuditUnavailable: The log is not open or a commit has failed.
        """
        if not self._accepting:
            raise self._error()
        self._queue.put((rec, None))

    async def record_durable(self, rec: AuditRecord) -> None:
        """Store ``rec`` and return once its batch is committed.

        If the caller is cancelled the record is still written.

        Raises:
            AuditUnavailable: The log is not open, ``rec`` is malformed, or the
                commit failed.
        """
        if not self._accepting:
            raise self._error()
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        self._queue.put((rec, waiter))
        self._urgent.set()
        await waiter

    async def flush(self) -> None:
        """Return once everything queued before this call is committed.

        Raises:
            AuditUnavailable: A commit failed (or the log never opened).
        """
        if self._state is _State.CLOSED:
            return
        if not self._accepting:
            raise self._error()
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        self._queue.put((None, waiter))
        self._urgent.set()
        await waiter

    # --- writer thread -------------------------------------------------------

    def _thread_main(self, opened: _Waiter, stopped: _Waiter) -> None:
        try:
            self._writer.open()
            if self._checkpoints is not None:
                self._checkpoints.open()
        except (AuditUnavailable, ConfigError) as err:
            self._writer.close()
            failure = err  # ``err`` is unbound when the except block ends
            _settle([opened], lambda: failure)
            _settle([stopped], None)
            return
        _settle([opened], None)
        try:
            self._write_until_stopped()
        finally:
            self._writer.close()
            if self._checkpoints is not None:
                self._checkpoints.close()
            _settle([stopped], None)

    def _write_until_stopped(self) -> None:
        stopping = False
        while True:
            if stopping:
                try:
                    items = [self._queue.get_nowait()]
                except queue.Empty:
                    self._write_unwritten_at_stop()
                    self._checkpoint(final=True)
                    return
            else:
                try:
                    items = [self._queue.get(timeout=self._idle_wait())]
                except queue.Empty:
                    if self._state is _State.FAILED:
                        self._try_recover()
                    else:
                        self._probe()
                    self._checkpoint()
                    self._maybe_recover()
                    continue
            self._gather(items, linger=not stopping)
            stopping = stopping or any(isinstance(item, _Stop) for item in items)
            try:
                self._write_batch(items)
            except Exception as err:  # a bug here must not leave callers waiting forever
                self._fail(f"audit writer crashed: {err!r}", err)
                _settle(_waiters_of(items), self._error)
            self._checkpoint()

    def _idle_wait(self) -> float | None:
        """How long the idle writer may block on the queue (None: until a record comes)."""
        if self._state is _State.FAILED:
            if self._writer.recoverable:
                return self._retry_in
            return self._retry if self._recoverable else None
        probe = _PROBE_SECONDS if self._writer.recoverable else None
        if self._checkpoints is None:
            return probe
        due = self._checkpoints.seconds_until_due(self._writer.count)
        return due if probe is None or (due is not None and due < probe) else probe

    def _probe(self) -> None:
        """While idle, check a remote store is still there: health then turns
        NOT_SERVING before the next call, not only when a commit fails."""
        if not self._writer.recoverable or self._state is not _State.OPEN:
            return
        try:
            self._writer.probe()
        except AuditUnavailable as err:
            self._fail(err.message, err.__cause__)

    def _try_recover(self) -> None:
        """Reopen a recoverable writer after a failure; on success the log accepts again."""
        if not self._writer.recoverable:
            return
        self._writer.close()
        try:
            self._writer.open()
        except (AuditUnavailable, ConfigError) as err:
            self._retry_in = min(self._retry_in * 2, _MAX_RETRY_SECONDS)
            _log.debug("audit log still unavailable: %s", err)
            return
        self._retry_in = _FIRST_RETRY_SECONDS
        if not self._write_unwritten():
            return
        if self._state is _State.FAILED:
            _log.warning("audit log recovered: %s is reachable again", self._writer.where)
            self._state, self._cause = _State.OPEN, None
            self._accepting = True
            self._tell(True)

    def _maybe_recover(self) -> None:
        """Reopen a log that failed on a commit; accept records again if it works.

        Opening runs a write transaction, so a disk that is still full or a
        file that is still read-only keeps the log failed. A chain head that
        moved back meanwhile keeps it failed too (someone cut the log). The
        kept records of answered calls are committed before anything new.
        """
        if self._state is not _State.FAILED or not self._recoverable:
            return
        if not self._reopen_where_it_was() or not self._write_unwritten():
            return
        _log.warning("%s: writable again, accepting records", self._writer.where)
        self._state, self._accepting, self._recoverable = _State.OPEN, True, False
        self._tell(True)

    def _reopen_where_it_was(self) -> bool:
        """Reopen the store; True if it opened with the chain head where it was."""
        count, last_hash = self._writer.count, self._writer.last_hash
        self._writer.close()
        try:
            self._writer.open()
        except (AuditUnavailable, ConfigError):
            self._writer.count, self._writer.last_hash = count, last_hash
            return False
        if self._writer.count < count or (
            self._writer.count == count and self._writer.last_hash != last_hash
        ):
            self._recoverable = False
            self._fail(f"{self._writer.where}: chain head moved back while failed", None)
            return False
        return True

    def _write_unwritten(self) -> bool:
        """Commit the kept records of answered calls; False (still kept) if that fails."""
        if not self._unwritten:
            return True
        try:
            self._writer.append(self._unwritten)
        except AuditUnavailable as err:
            _log.debug("audit log still unavailable: %s", err)
            return False
        self._unwritten = []
        self.batches_committed += 1
        return True

    def _write_unwritten_at_stop(self) -> None:
        """A last try to keep the records of answered calls before the writer ends."""
        if not self._unwritten:
            return
        if self._state is _State.FAILED and not self._reopen_where_it_was():
            written = False
        else:
            written = self._write_unwritten()
        if not written:
            _log.error(
                "%s: %d records of answered calls could not be written",
                self._writer.where,
                len(self._unwritten),
                extra={"reason": "AUDIT_UNAVAILABLE"},
            )

    def _checkpoint(self, *, final: bool = False) -> None:
        """Checkpoint the committed head if one is due; a failure fails the log closed."""
        if self._checkpoints is None or self._state is _State.FAILED:
            return
        try:
            self._checkpoints.maybe_write(self._writer.count, self._writer.last_hash, final=final)
        except AuditUnavailable as err:
            self._fail(err.message, err.__cause__)

    def _gather(self, items: list[_Item], *, linger: bool) -> None:
        """Add queued items to ``items``; linger while nobody waits on the batch.

        While lingering the writer sleeps on ``_urgent``, which only a durable
        record, a flush or close sets: plain records queue up without waking
        it (and without a GIL hand-off each).
        """
        if linger and not _is_urgent(items[0]):
            self._urgent.wait(self._linger)
        self._urgent.clear()  # anything urgent queued before this is drained below
        while len(items) < self._max_batch:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def _write_batch(self, items: list[_Item]) -> None:
        """Commit the batch's records in one transaction, then settle its waiters."""
        records: list[dict[str, object]] = []
        plain: list[dict[str, object]] = []  # records nobody waits on: their calls went ahead
        waiters: list[_Waiter] = []
        for item in items:
            if isinstance(item, _Stop):
                continue
            rec, waiter = item
            if rec is not None:
                try:
                    records.append(checked_fields(rec))
                    if waiter is None:
                        plain.append(records[-1])
                except (TypeError, ValueError) as err:
                    # One caller's bad record must not fail the log for everyone.
                    _log.error("audit record rejected: %s", err)
                    if waiter is not None:
                        why = f"malformed audit record: {err}"
                        _settle([waiter], functools.partial(AuditUnavailable, why))
                    continue
            if waiter is not None:
                waiters.append(waiter)
        if records and self._state is _State.FAILED:
            # Queued before the failure: these calls were answered, so keep them.
            self._unwritten.extend(plain)
        elif records:
            started = time.perf_counter()
            try:
                self._writer.append(records)
                self.batches_committed += 1
            except AuditUnavailable as err:
                self._fail(err.message, err.__cause__)
                # Outcomes of calls that already ran: written first after recovery.
                # (Refused callers were told; their records are not written later.)
                self._unwritten.extend(plain)
                if not self._writer.recoverable:
                    self._recoverable = self._retry is not None
            else:
                if self._observer is not None:
                    self._observer.audit_committed(records, time.perf_counter() - started)
        _settle(waiters, self._error if self._state is _State.FAILED else None)

    def _fail(self, why: str, cause: BaseException | None) -> None:
        _log.error("audit log failed closed: %s", why, extra={"reason": "AUDIT_UNAVAILABLE"})
        was_healthy, self._accepting = self._accepting, False
        self._state, self._why, self._cause = _State.FAILED, why, cause
        if was_healthy:
            self._tell(False)

    def _tell(self, healthy: bool) -> None:
        for listener in self._listeners:
            try:
                listener(healthy)
            except Exception:  # a listener's bug must not stop the writer
                _log.exception("audit health listener failed")

    def _error(self) -> AuditUnavailable:
        error = AuditUnavailable(self._why)
        error.__cause__ = self._cause
        return error


def _is_urgent(item: _Item) -> bool:
    """A caller waits on it (durable record, flush) or the log is stopping."""
    return isinstance(item, _Stop) or item[1] is not None


def _waiters_of(items: Iterable[_Item]) -> list[_Waiter]:
    return [item[1] for item in items if isinstance(item, tuple) and item[1] is not None]


def _settle(waiters: Iterable[_Waiter], error: _ErrorFactory | None) -> None:
    """Resolve futures from the writer thread, one loop callback per event loop.

    Args:
        waiters: Futures to resolve, possibly of different event loops.
        error: None to succeed them all, else a factory called once per
            future (a shared exception instance would pile up tracebacks).
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[_Waiter]] = defaultdict(list)
    for waiter in waiters:
        by_loop[waiter.get_loop()].append(waiter)
    for loop, group in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, group, error)
        except RuntimeError:
            pass  # that loop is closed: nobody is left to wake


def _resolve(waiters: list[_Waiter], error: _ErrorFactory | None) -> None:
    for waiter in waiters:
        if waiter.done():  # the caller was cancelled
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error())
