"""The push side of A2A tasks: the config methods, and the hook every task event passes.

:meth:`PushNotifier.event` is called for every event a background task
publishes (``BackgroundTask.publish``), on the event loop, and must cost next
to nothing when the task has no webhook: one dict lookup. For a task that has
webhooks it queues one notification per webhook in memory; a background writer
serializes the events (the ``StreamResponse`` JSON of the HTTP+JSON binding)
and commits them to the outbox in batches, then wakes the dispatcher. So a
notification is durable a few milliseconds after its event (the window a
crash may lose, as for the A2A task rows themselves).

Which tasks have webhooks is kept in memory for the tasks this process runs:
a config made here (``create``, or a ``SendMessage`` that carries one) is
followed at once; with other processes sharing the store (workers, replicas)
a config made by another process for a task running here is picked up by
:meth:`refresh`, which the dispatcher runs every second: events of that task
in the meantime are not pushed.

A caller may have ``[push] max_pending_per_peer`` notifications waiting;
beyond that its new ones are dropped and counted, and the dispatcher audits
the counts (``PUSH_BACKLOG_FULL``) once a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.audit import AuditLog
from gateway.config.push import PushSettings
from gateway.errors import GatewayError, InvalidRequest, PushConfigLimit, TaskNotFound
from gateway.push.configs import CONFIG_ID, ConfigRequest, accepted
from gateway.push.records import config_record
from gateway.push.store.store import Notification, PushConfig, PushStore
from policies.grants import PeerGrant

_log = logging.getLogger(__name__)

FOLLOW_GRACE_SECONDS = 10.0
"""A followed task not (or no longer) running here is forgotten after this long."""
_NOT_FOUND = "push notification config not found"


@dataclass(slots=True)
class _Followed:
    """The webhooks of one task: (config id, owner) pairs, and since when it is followed."""

    configs: list[tuple[str, str]] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Queued:
    """A notification whose event is not serialized yet."""

    owner: str
    task_id: str
    config_id: str
    event: Any
    created_ms: int


class PushNotifier:
    """Push configs of the callers' tasks, and the notifications their events become.

    The events are the protocol's (A2A ``StreamResponse``): ``body_of`` makes an
    event's POST body, ``ends`` says whether it is a task's last.

    Args:
        store: Configs and the outbox.
        settings: ``[push]``.
        audit: Where config changes are recorded.
        body_of: An event's body, exactly as POSTed.
        ends: True for the last event of a task (it is followed no more).
        runs_here: Whether this process runs a task (the A2A runs').
    """

    def __init__(
        self,
        store: PushStore,
        settings: PushSettings,
        audit: AuditLog,
        body_of: Callable[[Any], bytes],
        ends: Callable[[Any], bool],
        runs_here: Callable[[str], bool] = lambda _task_id: False,
    ) -> None:
        self._store = store
        self._body_of = body_of
        self._ends = ends
        self._settings = settings
        self._audit = audit
        self.runs_here = runs_here
        self._followed: dict[str, _Followed] = {}
        self._queue: list[_Queued] = []
        self._writer: asyncio.Task[None] | None = None
        self._pending: dict[str, int] = {}
        self._dropped: dict[str, tuple[int, str]] = {}
        self._seen_seq = 0
        self.wake: Callable[[], None] = lambda: None
        """Called once notifications are committed (the dispatcher's, while it runs)."""

    # --- the config methods (the servicer has checked the task is the caller's) ----

    async def create(
        self,
        owner: str,
        grant: PeerGrant,
        task_id: str,
        asked: ConfigRequest,
        operation: str,
        *,
        follow: bool,
    ) -> PushConfig:
        """Store ``owner``'s config for its task (replacing one of the same id); audited.

        ``follow``: the task has not ended (its events are pushed from now on).

        Raises:
            PushNotGranted, PushUrlRefused, InvalidRequest: see :func:`accepted`.
            PushConfigLimit: the task has ``max_configs_per_task`` other configs.
            StateUnavailable: the store failed.
        """
        config, url = accepted(owner, task_id, grant, asked, int(time.time() * 1000))
        existing = {c.config_id for c in await self._store.configs(owner, task_id)}
        most = self._settings.max_configs_per_task
        if config.config_id not in existing and len(existing) >= most:
            raise PushConfigLimit(f"the task has {most} push notification configs already")
        await self._store.put_config(config)
        if follow:
            self.follow(task_id, config.config_id, owner)
        await self._audit.record_durable(
            config_record(owner, task_id, operation, config.config_id, url.shown)
        )
        return config

    async def get(self, owner: str, task_id: str, config_id: str) -> PushConfig:
        """``owner``'s config ``config_id`` of its task.

        Raises:
            TaskNotFound: it has none by that id (the spec's error for it).
        """
        config = None
        if CONFIG_ID.fullmatch(config_id):
            config = await self._store.config(owner, task_id, config_id)
        if config is None:
            raise TaskNotFound(_NOT_FOUND)
        return config

    async def list_configs(self, owner: str, task_id: str) -> list[PushConfig]:
        """Every config of ``owner``'s task, oldest first."""
        return await self._store.configs(owner, task_id)

    async def delete(self, owner: str, task_id: str, config_id: str, operation: str) -> None:
        """Forget ``owner``'s config and its undelivered notifications (none: nothing); audited.

        Raises:
            InvalidRequest: ``config_id`` is not an id (no config has it; refused, so that
                every delete is audited, and never with a text unfit for the record).
        """
        if not CONFIG_ID.fullmatch(config_id):
            raise InvalidRequest("the push config id must be 1-128 characters of [A-Za-z0-9._:-]")
        followed = self._followed.get(task_id)
        if followed is not None:
            followed.configs = [c for c in followed.configs if c[0] != config_id]
        self._queue = [q for q in self._queue if (q.task_id, q.config_id) != (task_id, config_id)]
        await self._store.delete_config(owner, task_id, config_id)
        self.set_pending(await self._store.pending_by_owner())  # its rows went with it
        await self._audit.record_durable(config_record(owner, task_id, operation, config_id))

    def follow(self, task_id: str, config_id: str, owner: str) -> None:
        """Push ``task_id``'s events to config ``config_id`` from now on."""
        followed = self._followed.setdefault(task_id, _Followed())
        if (config_id, owner) not in followed.configs:
            followed.configs.append((config_id, owner))

    def follows(self, task_id: str) -> bool:
        """True when ``task_id``'s events are pushed from this process."""
        return task_id in self._followed

    # --- the hook ---------------------------------------------------------------

    def event(self, owner: str, task_id: str, event: Any) -> None:
        """Queue ``event`` of ``owner``'s task for each of its webhooks (none: nothing).

        Never raises: the task it is called from must not fail for its webhooks.
        """
        followed = self._followed.get(task_id)
        if followed is None:
            return
        try:
            self._queue_event(owner, task_id, event, followed)
        except Exception:  # a bug here must not end the task; the log keeps it
            _log.exception("push: an event of task %s was not queued", task_id)

    def _queue_event(self, owner: str, task_id: str, event: Any, followed: _Followed) -> None:
        now_ms = int(time.time() * 1000)
        most = self._settings.max_pending_per_peer
        for config_id, config_owner in followed.configs:
            if config_owner != owner:
                continue
            waiting = self._pending.get(owner, 0)
            if waiting >= most:
                count, _ = self._dropped.get(owner, (0, ""))
                self._dropped[owner] = (count + 1, task_id)
                continue
            self._pending[owner] = waiting + 1
            self._queue.append(_Queued(owner, task_id, config_id, event, now_ms))
        if self._ends(event):
            self._followed.pop(task_id, None)
        if self._queue and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            bodies: dict[int, bytes] = {}
            rows = []
            for queued in batch:
                body = bodies.get(id(queued.event))
                if body is None:
                    body = bodies[id(queued.event)] = self._body_of(queued.event)
                rows.append(
                    Notification(
                        queued.owner,
                        queued.task_id,
                        queued.config_id,
                        uuid.uuid4().hex,
                        body,
                        queued.created_ms,
                    )
                )
            try:
                await self._store.enqueue(rows)
            except GatewayError as err:  # the events are gone for their webhooks: say how many
                _log.error("push: %d notifications not queued: %s", len(rows), err.message)
                for row in rows:
                    self.settled(row.owner)
                continue
            self.wake()

    async def flush(self) -> None:
        """Wait until every queued notification is committed (or logged as lost)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    # --- upkeep (the dispatcher's rounds) ---------------------------------------

    async def start(self) -> None:
        """Count what waits in the outbox; follow only configs made from now on."""
        self.set_pending(await self._store.pending_by_owner())
        self._seen_seq = await self._store.last_config_seq()

    async def refresh(self, *, shared: bool) -> None:
        """Forget followed tasks that do not run here; with ``shared``, follow the
        configs other processes made for tasks that do."""
        now = time.monotonic()
        for task_id, followed in list(self._followed.items()):
            if now - followed.since > FOLLOW_GRACE_SECONDS and not self.runs_here(task_id):
                self._followed.pop(task_id, None)
        if not shared:
            return
        since_ms = int((time.time() - FOLLOW_GRACE_SECONDS) * 1000)
        for seq, task_id, config_id, owner in await self._store.configs_after(
            self._seen_seq, since_ms=since_ms
        ):
            self._seen_seq = max(self._seen_seq, seq)
            if self.runs_here(task_id):
                self.follow(task_id, config_id, owner)

    def set_pending(self, counts: dict[str, int]) -> None:
        """What waits in the outbox per caller (as counted by the store), plus the queue."""
        for queued in self._queue:
            counts[queued.owner] = counts.get(queued.owner, 0) + 1
        self._pending = counts

    def settled(self, owner: str) -> None:
        """One of ``owner``'s notifications left the outbox (delivered or given up)."""
        left = self._pending.get(owner, 0) - 1
        if left > 0:
            self._pending[owner] = left
        else:
            self._pending.pop(owner, None)

    def take_dropped(self) -> list[tuple[str, str, int]]:
        """(owner, a task id, count) of the notifications dropped since last asked."""
        dropped, self._dropped = self._dropped, {}
        return [(owner, task_id, count) for owner, (count, task_id) in dropped.items()]
