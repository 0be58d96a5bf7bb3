"""Background and streamed A2A tasks: one asyncio task per run, its events fanned out.

A ``SendMessage`` with ``return_immediately`` and every ``SendStreamingMessage``
become a :class:`BackgroundTask` once the call has passed every check of the
pipeline. Invariants:

* The task row is written (``SUBMITTED``) before its id is answered, and again
  at each change of state (``WORKING``, then how it ended); a finished row
  never changes again (see ``A2ATaskStore.save``).
* The run holds the call's in-flight slot until it ends, so a peer's running
  tasks count against its ``max_in_flight`` however long they take, and the
  handler audits the outcome once, as for any call.
* A listener (a stream or a subscription, see ``task_events``) gets the task
  as it is when it starts listening, then every event of the run in order;
  the last one is terminal (``COMPLETED`` after the output artifact,
  ``FAILED`` or ``CANCELED``), and then its stream ends.
* ``CancelTask`` cancels the capability (asyncio cancellation): the task ends
  ``CANCELED``, audited ``CANCELLED`` with who cancelled it. Shutdown cancels
  every run the same way, and they end ``FAILED`` with ``TASK_INTERRUPTED``.
* A capability that asks for input (``ctx.ask_input``) leaves its task
  ``INPUT_REQUIRED`` (or ``AUTH_REQUIRED``), saved at once, until the owner's
  next message on the task is admitted and handed to it (``BackgroundTask.answer``);
  a task waiting so is unfinished like a working one (leases, orphans, cancel).
* A quiet run (see ``task_events``) that ends with a Message before anything
  was published answers that Message: its row is deleted, no task is kept.
* A run is owned by this process (``process_id``, stored in the ``runner``
  column): it renews the lease of its unfinished rows every
  ``LEASE_RENEW_SECONDS``. An unfinished row whose process is gone is ended
  ``FAILED`` / ``TASK_INTERRUPTED``, never resumed: the input is not kept,
  and running a write again could write twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import timedelta
from typing import Any

from a2a.types import a2a_pb2

from capabilities.replies import is_message_reply
from gateway.errors import (
    AgentStopping,
    Cancelled,
    GatewayError,
    StateUnavailable,
    TaskInterrupted,
    TaskNotCancelable,
)
from gateway.inbound.invoke_handler import AdmittedCall, InvokeHandler, InvokeOutcome
from gateway.runtime.stopping import cancel_and_wait
from gateway.server.a2a import history
from gateway.server.a2a.left_answers import take_left_answers
from gateway.server.a2a.task_events import BackgroundTask, RunEvents, output_events, status_event
from gateway.server.a2a.task_store.store import A2ATask, A2ATaskStore, TaskOutcome
from gateway.server.a2a.task_view import final_message_json, message_event

_log = logging.getLogger(__name__)

LEASE_RENEW_SECONDS = 10.0
LEASE_SECONDS = 3 * LEASE_RENEW_SECONDS
"""How long a running process vouches for its unfinished tasks."""
PRUNE_EVERY_SECONDS = 3600.0
CANCEL_POLL_SECONDS = 1.0
"""How often a process with a shared store looks for cancel requests of its tasks."""
PROGRESS_SAVE_SECONDS = 0.25
"""Least time between two saves of a running task's row (its latest progress text)."""
CANCEL_WAIT_SECONDS = 10.0
"""How long CancelTask of a task run elsewhere waits for its end before answering."""
ABANDONED_MESSAGE = (
    "the call was cancelled (its deadline passed, or its caller went) while its task was "
    "being saved; nothing ran"
)
INTERRUPTED_MESSAGE = (
    "the agent stopped while the task ran; it was not resumed, and a write capability "
    "may have run partly or fully"
)


class BackgroundTasks:
    """The background tasks this process runs, and the upkeep of their rows.

    Args:
        handler: Runs and audits each admitted call.
        store: Where the tasks are kept.
        shared: Other processes use ``store`` as well (workers, or replicas on
            PostgreSQL): at start only tasks whose lease has passed are orphans.
        retention: Finished tasks older than this are deleted (at start, then hourly).
        notify: Called with (owner, task id, event) for every event a run
            publishes (the push notifier's hook; None: push is off).
    """

    def __init__(
        self,
        handler: InvokeHandler,
        store: A2ATaskStore,
        *,
        shared: bool = False,
        retention: timedelta = timedelta(days=7),
        notify: Callable[[str, str, a2a_pb2.StreamResponse], None] | None = None,
    ) -> None:
        self._handler = handler
        self._notify = notify
        self._store = store
        self._shared = shared
        self._retention = retention
        self.process_id = uuid.uuid4().hex
        """This process's name on the rows of the tasks it runs."""
        self._runs: dict[str, BackgroundTask] = {}
        self._unsaved: list[A2ATask] = []
        self._saves: set[asyncio.Task[None]] = set()
        self._upkeep: list[asyncio.Task[None]] = []
        self._closing = False
        self.stopping = asyncio.Event()
        """Set when shutdown begins: subscriptions following tasks run elsewhere end."""

    @property
    def shared(self) -> bool:
        """Other processes of this agent use the store too (workers, replicas)."""
        return self._shared

    def running(self, task_id: str) -> BackgroundTask | None:
        """The run of ``task_id`` if this process runs it (None otherwise)."""
        return self._runs.get(task_id)

    def __len__(self) -> int:
        return len(self._runs)

    def waiting(self) -> bool:
        """Some task this process runs waits for its caller's answer."""
        return any(run.waiting is not None for run in self._runs.values())

    async def start(
        self, task: A2ATask, admitted: AdmittedCall, *, quiet: bool = False
    ) -> BackgroundTask:
        """Save ``task`` (SUBMITTED), then run ``admitted`` in the background.

        The job starts at the loop's next turn: a ``run.listen()`` (or
        ``run.next_settled()``) right after this returns (no await between)
        sees every event. Whatever happens, the call's slot is given back.
        ``quiet``: publish WORKING only once the capability does something
        (it may still answer with a lone Message; see ``task_events``).

        Raises:
            StateUnavailable: the task could not be saved (nothing ran).
            AgentStopping: the agent is stopping (nothing ran).
        """
        try:
            if self._closing:
                raise AgentStopping(
                    "the agent is stopping; send the message again later, with a new message_id"
                )
            saving = asyncio.ensure_future(self._store.save(task, self.process_id, _lease_ms()))
            try:
                await asyncio.shield(saving)
            except asyncio.CancelledError:
                # The row is written in a thread, which a cancel does not stop: it
                # may land all the same. End it and audit the call, never run it.
                self._spawn(self._abandon(saving, task, admitted))
                raise
        except BaseException:
            if admitted.slot is not None:
                admitted.slot.release()
            raise
        run = BackgroundTask(
            task, admitted, keeps_chunks=self._shared, unannounced=quiet, notify=self._notify
        )
        run.progressed = lambda: self._save_latest(run)
        run.changed = lambda changed: self._change(run, changed)
        self._runs[task.task_id] = run
        run.job = asyncio.get_running_loop().create_task(self._drive(run))
        return run

    async def _drive(self, run: BackgroundTask) -> None:
        run.started.set()
        try:
            working = replace(run.task, state=TaskOutcome.WORKING)
            if run.unannounced:  # published with the capability's first event (task_events)
                run.task = working
                self._save_latest(run)
            else:
                self._change(run, working)
            outcome = await self._handler.run(run.admitted, RunEvents(run))
            ended = _completed(run.task, outcome)
        except GatewayError as err:
            ended = _failed(run.task, TaskOutcome.FAILED, err)
        except asyncio.CancelledError:
            stop = run.stop if run.stop is not None else TaskInterrupted(INTERRUPTED_MESSAGE)
            state = TaskOutcome.CANCELED if isinstance(stop, Cancelled) else TaskOutcome.FAILED
            ended = _failed(run.task, state, stop)
        except Exception:  # a bug must still end the task and its streams; the log keeps it
            _log.exception("A2A task %s failed unexpectedly", run.task.task_id)
            ended = _failed(run.task, TaskOutcome.FAILED, GatewayError("internal error"))
        finally:
            if run.admitted.slot is not None:
                run.admitted.slot.release()
        await self._end(run, ended)

    def _change(self, run: BackgroundTask, task: A2ATask) -> None:
        """A running task's new state: published now, saved in the background (an
        interrupted one at once, and once saved it answers the blocking sends waiting
        for it: a GetTask or ListTasks after that answer finds it so, on any process)."""
        run.task = task
        run.publish(status_event(task))
        if task.state.waiting:
            run.save_now.set()
        self._save_latest(run)

    def _save_latest(self, run: BackgroundTask) -> None:
        """Save ``run.task`` as it is (state, latest progress text) for other processes,
        and the output chunks emitted since the last save (a shared store only).

        One save per run at a time, in order, at most every ``PROGRESS_SAVE_SECONDS``
        after the first: a capability reporting progress in a tight loop costs
        its row a few writes a second, and the latest text always lands. The end
        is saved by ``_end`` (a row that has ended is never changed again).
        """
        if run.saving:
            run.save_wanted = True
            return
        run.saving = True
        self._spawn(self._saver(run))

    async def _saver(self, run: BackgroundTask) -> None:
        try:
            while not run.task.state.finished:
                run.save_wanted = False
                run.save_now.clear()
                started, snapshot = time.monotonic(), run.task
                await self._keep_chunks(run)  # first: a follower that sees the row has them
                await self._save_quietly(snapshot)
                if snapshot.state.waiting:
                    run.settle(snapshot)
                if not run.save_wanted:
                    return
                pause = max(0.0, started + PROGRESS_SAVE_SECONDS - time.monotonic())
                with contextlib.suppress(TimeoutError):  # a question is saved at once
                    async with asyncio.timeout(pause):
                        await run.save_now.wait()
        finally:
            run.saving = False

    async def _save_quietly(self, task: A2ATask) -> None:
        try:
            await self._store.save(task, self.process_id, _lease_ms())
        except StateUnavailable as err:  # the end is saved (or retried) all the same
            _log.warning("A2A task %s: state %s not saved: %s", task.task_id, task.state, err)

    async def _abandon(
        self, saving: asyncio.Future[bool], task: A2ATask, admitted: AdmittedCall
    ) -> None:
        """End the row of a task whose caller went while it was saved; audit the call once."""
        stop = Cancelled(ABANDONED_MESSAGE, detail="cancelled while its task was saved")
        try:
            saved = await saving
        except StateUnavailable:
            saved = False
        if saved:
            await self._save_end(_failed(task, TaskOutcome.CANCELED, stop))
        await self._handler.abandon(admitted, stop)

    async def _save_end(self, ended: A2ATask) -> bool:
        """Save a task's end; if the store cannot take it now, retry it in the upkeep."""
        try:
            await self._store.save(ended)
        except StateUnavailable as err:
            _log.error("A2A task %s: end not saved yet (retried): %s", ended.task_id, err)
            self._unsaved.append(ended)
            return False
        return True

    async def _keep_chunks(self, run: BackgroundTask) -> None:
        """Keep the chunks emitted since the last save; on failure, try them again next time."""
        chunks, run.unsaved_chunks = run.unsaved_chunks, []
        if not chunks:
            return
        try:
            await self._store.add_chunks(run.task.owner, run.task.task_id, run.chunks_kept, chunks)
        except StateUnavailable as err:
            _log.warning("A2A task %s: %d chunks not kept: %s", run.task.task_id, len(chunks), err)
            run.unsaved_chunks[:0] = chunks
            return
        run.chunks_kept += len(chunks)

    async def _end(self, run: BackgroundTask, ended: A2ATask) -> None:
        completed = ended.state is TaskOutcome.COMPLETED
        if completed and run.unannounced and is_message_reply(ended.output):
            await self._end_with_message(run, ended)
            return
        if completed and run.contract_asks:
            final = final_message_json(ended)
            if final is not None:
                ended = replace(ended, history=history.appended(ended.history, "agent", *final))
        run.announce()  # a quiet run that did nothing visible: WORKING, then its end
        run.task = ended
        if await self._save_end(ended) and run.chunks_kept:
            # The output holds them all; prune drops them otherwise.
            with contextlib.suppress(StateUnavailable):
                await self._store.drop_chunks(ended.task_id)
        if completed:
            for event in output_events(ended):
                run.publish(event)
        run.publish(status_event(ended), last=True)
        self._settle_end(run)

    async def _end_with_message(self, run: BackgroundTask, ended: A2ATask) -> None:
        """A quiet run answered a Message before anything was published: the answer is
        that Message, and no task is kept (its row goes)."""
        run.task, run.message_only = ended, True
        try:
            await self._store.forget(ended.owner, ended.task_id)
        except StateUnavailable as err:  # its end is kept instead: still not a task anyone saw
            _log.warning("A2A task %s: row of a Message answer not deleted: %s", ended.task_id, err)
            await self._save_end(ended)
        run.publish(message_event(ended), last=True)
        self._settle_end(run)

    def _settle_end(self, run: BackgroundTask) -> None:
        run.ended.set()
        run.settle(run.task)
        self._runs.pop(run.task.task_id, None)

    async def cancel(self, run: BackgroundTask, canceller: str) -> A2ATask:
        """Cancel ``run`` for ``canceller`` (its owner) and wait until it has ended.

        A cancel already under way (another ``CancelTask``) is waited for, and its
        end answered: the task is ending as this one asked.

        Raises:
            TaskNotCancelable: it ended before it could be cancelled (or is ending
                for another cause: the agent's stop).
        """
        if isinstance(run.stop, Cancelled):
            await asyncio.shield(run.ended.wait())
            return run.task
        if run.task.state.finished or run.job is None or run.stop is not None:
            raise TaskNotCancelable("the task has already finished")
        await _started(run)
        if isinstance(run.stop, Cancelled):
            await asyncio.shield(run.ended.wait())
            return run.task
        if run.task.state.finished or run.stop is not None:
            raise TaskNotCancelable("the task has already finished")
        may_have_run = "; a write capability may have run" if run.writes else ""
        run.stop = Cancelled(f"canceled by {canceller}{may_have_run}")
        run.job.cancel(f"A2A CancelTask by {canceller}{may_have_run}")
        await asyncio.shield(run.ended.wait())
        return run.task

    # --- upkeep: orphans, leases, retention -----------------------------------

    async def recover(self) -> None:
        """At start: end the orphaned tasks as FAILED, delete those past retention."""
        await self._fail_orphans(any_lease=not self._shared)
        await self._prune()

    def start_upkeep(self) -> None:
        """Renew leases, end orphans, retry unsaved ends and prune, in the background.

        With a shared store, also carry out the cancel requests other processes
        of this agent recorded for the tasks running here (every second), and
        take the answers they admitted for its waiting tasks (``left_answers``).
        """
        loop = asyncio.get_running_loop()
        self._upkeep = [loop.create_task(self._keep_up())]
        if self._shared:
            self._upkeep.append(loop.create_task(self._watch_cancel_requests()))
            answers = take_left_answers(self, self._store, self._handler)
            self._upkeep.append(loop.create_task(answers))

    async def cancel_elsewhere(self, task: A2ATask, canceller: str) -> A2ATask:
        """Cancel ``task``, run by another process of this agent (a shared store).

        Records the request, which that process carries out within about a
        second, and waits up to ``CANCEL_WAIT_SECONDS`` for the task's end;
        returns the task as it then is (still running if that process is slow).

        Raises:
            TaskNotCancelable: it has ended, or no other process can be running it.
        """
        if not self._shared or not await self._store.request_cancel(
            task.owner, task.task_id, canceller
        ):
            raise TaskNotCancelable("the task has already finished")
        latest, waited = task, 0.0
        while waited < CANCEL_WAIT_SECONDS and not latest.state.finished:
            await asyncio.sleep(CANCEL_POLL_SECONDS / 4)
            waited += CANCEL_POLL_SECONDS / 4
            latest = await self._store.get(task.owner, task.task_id, task.user) or latest
        return latest

    async def _watch_cancel_requests(self) -> None:
        while True:
            await asyncio.sleep(CANCEL_POLL_SECONDS)
            if not self._runs:
                continue  # nothing runs here: no query at all
            try:
                requests = await self._store.cancel_requests(self.process_id)
            except GatewayError as err:
                _log.warning("A2A cancel requests not read: %s", err.message)
                continue
            for task_id, canceller in requests:
                run = self._runs.get(task_id)
                if run is not None and run.stop is None and not run.task.state.finished:
                    self._spawn(self._cancel_quietly(run, canceller))

    async def _cancel_quietly(self, run: BackgroundTask, canceller: str) -> None:
        with contextlib.suppress(TaskNotCancelable):
            await self.cancel(run, canceller)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        job = asyncio.get_running_loop().create_task(work)
        self._saves.add(job)
        job.add_done_callback(self._saves.discard)

    async def _keep_up(self) -> None:
        last_prune = time.monotonic()
        while True:
            await asyncio.sleep(LEASE_RENEW_SECONDS)
            try:
                await self._store.renew_leases(self.process_id, _lease_ms())
                for task in list(self._unsaved):
                    await self._store.save(task)
                    self._unsaved.remove(task)
                if self._shared:  # alone, only this process has run tasks since start
                    await self._fail_orphans(any_lease=False)
                if time.monotonic() - last_prune >= PRUNE_EVERY_SECONDS:
                    await self._prune()
                    last_prune = time.monotonic()
            except GatewayError as err:  # the next round tries again
                _log.warning("A2A task upkeep failed: %s", err.message)
            except Exception:  # never let one bad round end the upkeep for good
                _log.exception("A2A task upkeep failed")

    async def _fail_orphans(self, *, any_lease: bool) -> None:
        orphans = await self._store.fail_orphans(
            self.process_id,
            int(time.time() * 1000),
            TaskInterrupted.reason,
            INTERRUPTED_MESSAGE,
            any_lease=any_lease,
        )
        if orphans:
            _log.warning(
                "A2A: %d task(s) were running when their agent stopped; ended %s",
                len(orphans),
                TaskInterrupted.reason,
            )

    async def _prune(self) -> None:
        cutoff = int((time.time() - self._retention.total_seconds()) * 1000)
        pruned = await self._store.prune(cutoff)
        if pruned:
            _log.info("A2A: deleted %d finished task(s) older than %s", pruned, self._retention)

    async def shutdown(self) -> None:
        """End every run (``FAILED``, ``TASK_INTERRUPTED``) and its streams; stop upkeep.

        From here on ``start`` refuses new runs.
        """
        self._closing = True
        self.stopping.set()
        for upkeep in self._upkeep:
            await cancel_and_wait(upkeep)
        runs = list(self._runs.values())
        for run in runs:
            await _started(run)
            if run.job is not None and run.stop is None and not run.task.state.finished:
                run.stop = TaskInterrupted(INTERRUPTED_MESSAGE)
                run.job.cancel("agent stopping")
        for run in runs:
            await run.ended.wait()
        for task in list(self._unsaved):
            with contextlib.suppress(StateUnavailable):
                await self._store.save(task)
        if self._saves:
            await asyncio.gather(*self._saves, return_exceptions=True)


async def _started(run: BackgroundTask) -> None:
    # A job cancelled before its first step would never run its own ending;
    # only this module cancels jobs, and always after this.
    if run.job is not None and not run.job.done():
        await run.started.wait()


def _lease_ms() -> int:
    return int((time.time() + LEASE_SECONDS) * 1000)


def _completed(task: A2ATask, outcome: InvokeOutcome) -> A2ATask:
    return replace(
        task,
        state=TaskOutcome.COMPLETED,
        output=outcome.payload,
        evidence_sha256=outcome.evidence_sha256,
        remembered=outcome.remembered,
        reason="OK",
        message="",
        status_json=b"",
        asked_schema="",
        updated_ms=int(time.time() * 1000),
    )


def _failed(task: A2ATask, state: TaskOutcome, err: GatewayError) -> A2ATask:
    return replace(
        task,
        state=state,
        reason=err.reason,
        message=err.remote_message,  # the task is the caller's: no internals
        status_json=b"",  # a question it may have shown is not its end
        asked_schema="",
        updated_ms=int(time.time() * 1000),
    )
