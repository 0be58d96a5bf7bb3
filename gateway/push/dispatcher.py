"""The delivery worker: claims due notifications from the outbox and makes their attempts.

A service (``start``/``stop``). Each round (when the notifier commits new
notifications, when a delivery ends, and every second anyway) it claims up to
the free places under ``[push] max_concurrent`` (each claimed row the oldest of
its webhook, so a webhook gets its events in order, one at a time) and starts
one attempt for each, at most ``max_concurrent_per_peer`` per caller (a caller
with no room is left out of the claim, so it cannot crowd the others out; a
row claimed beyond a caller's room is released for a later round). An attempt:

1. reads the config (gone: the notification is dropped, nothing is sent) and
   the caller's grant as it is now: the host must still be in its
   ``push_hosts``, from a live grant;
2. signs the body (:mod:`gateway.push.signature`) and makes the attempt
   (:mod:`gateway.push.sender`);
3. audits it (:mod:`gateway.push.records`), then removes the row when it was
   delivered, refused, not worth retrying or the ``max_attempts``-th; else
   it is due again after a backoff: ``retry_initial * 2**(attempts-1)``, at
   most ``retry_max``, times a random factor in [0.5, 1) (jitter, so webhooks
   that failed together do not all come back together).

The round also audits dropped notifications (``PUSH_BACKLOG_FULL``), follows
configs other processes made (shared stores), recounts the backlogs, and
hourly deletes configs and rows older than ``[a2a] task_retention``. At stop,
attempts under way get the grace to finish; those cancelled keep their row,
and their lease is ended: a later start (or another process) attempts them
again. A process that dies holding a lease leaves it to lapse (twice
``[push] timeout`` and 30 s); a lone process ends every lease when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gateway.audit import AuditLog
from gateway.config.push import PushSettings
from gateway.errors import AgentConfigError, GatewayError, PushUrlRefused
from gateway.push.configs import request_headers
from gateway.push.notifier import PushNotifier
from gateway.push.records import attempt_record, dropped_record
from gateway.push.sender import HOST_NOT_ALLOWED, Attempt, WebhookSender
from gateway.push.signature import SIGNATURE_HEADER, NotificationSigner
from gateway.push.store.store import Delivery, PushConfig, PushStore
from gateway.push.webhook_url import WebhookUrl, parse_webhook_url
from gateway.runtime.stopping import cancel_and_wait
from policies.store import PolicyStore

_log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
"""Longest pause between two rounds."""
PRUNE_EVERY_SECONDS = 3600.0


class PushDispatcher:
    """Delivers the outbox's notifications (see the module doc).

    Args:
        store: Configs and the outbox.
        notifier: The hook's side (backlogs, drops, followed configs).
        sender: Makes the attempts.
        signer: Signs each body with the agent's SVID key.
        policies: The policy in force (the callers' ``push_hosts``).
        audit: Where every attempt is recorded.
        settings: ``[push]``.
        shared: Other processes use the same store.
        retention: Configs and rows older than this are deleted.
        jitter: Random numbers in [0, 1) for the backoff (tests pass their own).
    """

    def __init__(
        self,
        store: PushStore,
        notifier: PushNotifier,
        sender: WebhookSender,
        signer: NotificationSigner,
        policies: PolicyStore,
        audit: AuditLog,
        settings: PushSettings,
        *,
        shared: bool = False,
        retention: timedelta = timedelta(days=7),
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self.notifier = notifier
        """The hook's side: the config methods, and what task events become."""
        self.sender = sender
        self._signer = signer
        self._policies = policies
        self._audit = audit
        self._settings = settings
        self._shared = shared
        self._retention = retention
        self._jitter = jitter
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._attempts: dict[asyncio.Task[None], str] = {}
        self._claims: dict[asyncio.Task[None], int] = {}
        self._last_prune = 0.0
        # Longer than an attempt can take: a live process never loses its claim.
        self._lease_ms = int((2 * settings.timeout + 30) * 1000)

    @property
    def is_running(self) -> bool:
        """True while delivery rounds run: from :meth:`start` until :meth:`stop`."""
        return self._loop_task is not None and not self._loop_task.done()

    def wake(self) -> None:
        """Start a round now (new notifications, a webhook free again)."""
        self._wakeup.set()

    async def start(self) -> None:
        """Open the HTTP client, count the backlogs, then run rounds in the background.

        Raises:
            AgentConfigError: ``[push] ca`` cannot be read or holds no certificate.
            StateUnavailable: the store cannot be read.
        """
        try:
            self.sender.open()
        except (OSError, ssl.SSLError) as err:
            raise AgentConfigError(f"push.ca {self._settings.ca}: {err}") from err
        if not self._shared:  # alone: a lease left here was this agent's, cut by its stop
            await self._store.release_all()
        await self.notifier.start()
        self.notifier.wake = self.wake
        self._loop_task = asyncio.get_running_loop().create_task(self._rounds())

    async def stop(self, grace: float) -> None:
        """Commit queued notifications, stop claiming, give attempts ``grace`` seconds."""
        self.notifier.wake = lambda: None
        with contextlib.suppress(GatewayError):
            await self.notifier.flush()
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
        attempts = list(self._attempts)
        if attempts:
            _, late = await asyncio.wait(attempts, timeout=grace)
            for attempt in late:
                attempt.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            for attempt in late:  # due again at once, here after a restart or elsewhere
                with contextlib.suppress(GatewayError):
                    await self._store.release(self._claims[attempt])
        self._audit_dropped()
        await self.sender.close()

    async def _rounds(self) -> None:
        while True:
            self._wakeup.clear()
            try:
                await self._round()
            except GatewayError as err:  # the next round tries again
                _log.warning("push deliveries: %s", err.message)
            except Exception:  # never let one bad round end deliveries for good
                _log.exception("push deliveries failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_SECONDS):
                    await self._wakeup.wait()

    async def _round(self) -> None:
        self._audit_dropped()
        await self.notifier.refresh(shared=self._shared)
        if self._shared:
            self.notifier.set_pending(await self._store.pending_by_owner())
        if time.monotonic() - self._last_prune >= PRUNE_EVERY_SECONDS:
            self._last_prune = time.monotonic()
            cutoff = datetime.now(UTC) - self._retention
            if await self._store.prune(int(cutoff.timestamp() * 1000)):
                self.notifier.set_pending(await self._store.pending_by_owner())
        free = self._settings.max_concurrent - len(self._attempts)
        if free <= 0:
            return
        now_ms = int(time.time() * 1000)
        running = Counter(self._attempts.values())
        room = self._settings.max_concurrent_per_peer
        full = sorted(owner for owner, count in running.items() if count >= room)
        for delivery in await self._store.claim(now_ms, now_ms + self._lease_ms, free, full):
            owner = delivery.notification.owner
            if running[owner] >= room:  # claimed beyond its room in this round: next round
                await self._store.release(delivery.seq)
                continue
            running[owner] += 1
            task = asyncio.get_running_loop().create_task(self._deliver(delivery))
            self._attempts[task], self._claims[task] = owner, delivery.seq
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._attempts.pop(task, None)
        if not task.cancelled():
            self._claims.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            _log.error("push delivery failed unexpectedly", exc_info=task.exception())
        self.wake()

    def _audit_dropped(self) -> None:
        for owner, task_id, count in self.notifier.take_dropped():
            self._audit.record(dropped_record(owner, task_id, count))

    async def _deliver(self, delivery: Delivery) -> None:
        n = delivery.notification
        config = await self._store.config(n.owner, n.task_id, n.config_id)
        if config is None:  # deleted since: nothing more goes to that webhook
            await self._store.finish(delivery.seq)
            self.notifier.settled(n.owner)
            return
        started = time.perf_counter()
        try:
            url: WebhookUrl | None = parse_webhook_url(config.url)
        except PushUrlRefused:  # stored under an older, looser rule
            url = None
        if url is None:
            attempt = Attempt(HOST_NOT_ALLOWED, refused=True, note="url")
        else:
            attempt = await self._attempt(config, url, delivery)
        latency_ms = (time.perf_counter() - started) * 1000.0
        number, most = delivery.attempts + 1, self._settings.max_attempts
        again = attempt.retry and number < most
        retry_in_ms = self._backoff_ms(number) if again else None
        self._audit.record(
            attempt_record(
                owner=n.owner,
                task_id=n.task_id,
                config_id=n.config_id,
                notification_id=n.notification_id,
                shown=url.shown if url is not None else "?",
                body=n.body,
                attempt=attempt,
                number=number,
                most=most,
                retry_in_ms=retry_in_ms,
                latency_ms=latency_ms,
            )
        )
        if retry_in_ms is None:
            await self._store.finish(delivery.seq)
            self.notifier.settled(n.owner)
        else:
            await self._store.retry_later(
                delivery.seq, number, int(time.time() * 1000) + retry_in_ms
            )

    async def _attempt(self, config: PushConfig, url: WebhookUrl, delivery: Delivery) -> Attempt:
        grant = self._policies.current.grants.get(config.owner)
        live = grant is not None and grant.expires_at > datetime.now(UTC)
        push_hosts = grant.push_hosts if live and grant is not None else ()
        n = delivery.notification
        headers = request_headers(config)
        headers[SIGNATURE_HEADER] = self._signer.sign(
            n.body, url=config.url, notification_id=n.notification_id
        )
        attempt = await self.sender.attempt(url, push_hosts, headers, n.body)
        if attempt.reason == HOST_NOT_ALLOWED and not live:
            return Attempt(HOST_NOT_ALLOWED, refused=True, note="no-live-grant")
        return attempt

    def _backoff_ms(self, attempts: int) -> int:
        """The wait before attempt ``attempts + 1``: doubled each time, capped, jittered."""
        settings = self._settings
        delay = min(settings.retry_max, settings.retry_initial * 2 ** (attempts - 1))
        return int(delay * (0.5 + 0.5 * self._jitter()) * 1000)
