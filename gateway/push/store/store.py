"""Push configs and the outbox of notifications: the interface and the SQL both backends share.

Two tables (SQLite ``push.sqlite`` under ``state_dir``; PostgreSQL, keyed by
agent id as well, shared by the replicas of an agent):

- ``push_configs``: one row per (task, config id): the owner, the webhook URL,
  its token and credentials. Every read names the owner, so another caller's
  config is the same empty answer as one that never existed. The credentials
  are secrets: the file is private to the agent's user (0600), they are never
  logged, and only their owner reads them back.
- ``push_outbox``: one row per (notification, config): the body as it will be
  POSTed, its attempts so far and when the next may start. A row stays until
  its notification is delivered or given up, so a restart (or a crash) loses
  none that were committed: delivery is at least once.

A row is *claimed* for one attempt by setting its lease: only the oldest row of
each config can be claimed, and only once its lease has passed, so one
webhook gets its notifications in order and one at a time, whichever process
(worker, replica) claims it. A process that dies holding a lease lets it
lapse; the row is then claimed again (an attempt may repeat: receivers
deduplicate on the notification id).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.sql.dialect import Dialect

CONFIG_COLUMNS = "task_id, config_id, owner, url, token, auth_scheme, auth_credentials, created_ms"
"""The columns of ``push_configs`` in :class:`PushConfig` field order."""
OUTBOX_COLUMNS = "owner, task_id, config_id, notification_id, body, next_ms, created_ms"
"""The columns an enqueued notification fills (:func:`outbox_row` order)."""
_CLAIMED = "seq, owner, task_id, config_id, notification_id, body, attempts, created_ms"


@dataclass(frozen=True, slots=True)
class PushConfig:
    """One webhook of one task.

    Attributes:
        task_id: The task it follows.
        config_id: Its id (the caller's, or one made for it), unique per task.
        owner: The SPIFFE ID of the task's owner, who made it.
        url: The webhook URL, as given.
        token: The config's token (sent as ``X-A2A-Notification-Token``; "" none).
        auth_scheme: The ``Authorization`` scheme ("" for none).
        auth_credentials: The credentials sent with that scheme.
        created_ms: When it was made (Unix ms).
    """

    task_id: str
    config_id: str
    owner: str
    url: str
    token: str
    auth_scheme: str
    auth_credentials: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class Notification:
    """One event of a task, to be POSTed to one of its webhooks.

    Attributes:
        owner: The task's owner.
        task_id: The task.
        config_id: The webhook's config.
        notification_id: Its id (the JWS ``jti``), the same on every attempt.
        body: The ``StreamResponse`` JSON, exactly as it is sent.
        created_ms: When the event was published (Unix ms).
    """

    owner: str
    task_id: str
    config_id: str
    notification_id: str
    body: bytes
    created_ms: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """A claimed outbox row: one notification, up for its next attempt.

    Attributes:
        seq: Its row.
        notification: What to send.
        attempts: Attempts made before this one.
    """

    seq: int
    notification: Notification
    attempts: int


def outbox_row(notification: Notification) -> tuple[object, ...]:
    """The values of :data:`OUTBOX_COLUMNS` for ``notification`` (due at once)."""
    n = notification
    return (n.owner, n.task_id, n.config_id, n.notification_id, n.body, 0, n.created_ms)


class PushStore(ABC):
    """Push configs and the outbox (see the module doc); safe to share between threads.

    The statements are written once here over a :class:`~gateway.sql.dialect.Dialect`;
    the backends (:class:`~gateway.push.store.sqlite.SqlitePushStore`,
    :class:`~gateway.push.store.postgres.PostgresPushStore`) hold only their
    connection. Each raises :class:`~gateway.errors.StateUnavailable` when its
    database fails.

    Args:
        sql: The backend's dialect.
        scope: The values of its scope columns (the agent id in PostgreSQL).
    """

    def __init__(self, sql: Dialect, scope: tuple[str, ...] = ()) -> None:
        self._mark = sql.mark
        self._key_names = sql.scope
        self._scope_values = scope

    @abstractmethod
    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of one statement (a transaction of its own), run in a thread."""

    @abstractmethod
    async def _insert_many(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        """One statement for each of ``rows``, in one transaction, run in a thread."""

    @abstractmethod
    def close(self) -> None:
        """Release the store."""

    def _key(self) -> tuple[str, ...]:
        return self._scope_values

    # --- configs ---------------------------------------------------------------

    async def put_config(self, config: PushConfig) -> None:
        """Store ``config``, replacing the one of the same task and id (same owner only)."""
        columns = CONFIG_COLUMNS.split(", ")
        marks = ", ".join([self._mark] * (len(self._key()) + len(columns)))
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns[3:7])
        await self._query(
            f"INSERT INTO push_configs ({self._columns()}{CONFIG_COLUMNS}) VALUES ({marks}) "
            f"ON CONFLICT ({self._columns()}task_id, config_id) DO UPDATE SET {updates} "
            "WHERE push_configs.owner = excluded.owner RETURNING config_id",
            (*self._key(), *_config_row(config)),
        )

    async def config(self, owner: str, task_id: str, config_id: str) -> PushConfig | None:
        """``owner``'s config ``config_id`` of ``task_id`` (None: it has none by that id)."""
        mark = self._mark
        rows = await self._query(
            f"SELECT {CONFIG_COLUMNS} FROM push_configs WHERE {self._where()}owner = {mark} "
            f"AND task_id = {mark} AND config_id = {mark}",
            (*self._key(), owner, task_id, config_id),
        )
        return _config(rows[0]) if rows else None

    async def configs(self, owner: str, task_id: str) -> list[PushConfig]:
        """``owner``'s configs of ``task_id``, oldest first."""
        mark = self._mark
        rows = await self._query(
            f"SELECT {CONFIG_COLUMNS} FROM push_configs WHERE {self._where()}owner = {mark} "
            f"AND task_id = {mark} ORDER BY seq",
            (*self._key(), owner, task_id),
        )
        return [_config(row) for row in rows]

    async def delete_config(self, owner: str, task_id: str, config_id: str) -> None:
        """Forget ``owner``'s config (nothing if it has none), then its undelivered rows."""
        mark = self._mark
        where = f"{self._where()}owner = {mark} AND task_id = {mark} AND config_id = {mark}"
        params = (*self._key(), owner, task_id, config_id)
        await self._query(f"DELETE FROM push_configs WHERE {where} RETURNING config_id", params)
        # A row left by a failure here is dropped when claimed: its config is gone.
        await self._query(f"DELETE FROM push_outbox WHERE {where} RETURNING seq", params)

    async def configs_after(
        self, seq: int, *, since_ms: int | None = None
    ) -> list[tuple[int, str, str, str]]:
        """(seq, task id, config id, owner) of every config stored after row ``seq``, and of
        those made at ``since_ms`` or later (rows numbered before they were committed)."""
        mark = self._mark
        recent = "" if since_ms is None else f" OR created_ms >= {mark}"
        rows = await self._query(
            f"SELECT seq, task_id, config_id, owner FROM push_configs WHERE {self._where()}"
            f"(seq > {mark}{recent}) ORDER BY seq",
            (*self._key(), seq, *(() if since_ms is None else (since_ms,))),
        )
        return [(int(row[0]), str(row[1]), str(row[2]), str(row[3])) for row in rows]

    async def last_config_seq(self) -> int:
        """The row number of the newest config (0 when there is none)."""
        where = self._where().removesuffix("AND ")
        rows = await self._query(
            f"SELECT COALESCE(MAX(seq), 0) FROM push_configs {f'WHERE {where}' if where else ''}",
            self._key(),
        )
        return int(rows[0][0])

    # --- the outbox ---------------------------------------------------------------

    async def enqueue(self, notifications: Sequence[Notification]) -> None:
        """Add ``notifications`` to the outbox, due at once (one transaction)."""
        marks = ", ".join([self._mark] * (len(self._key()) + 7))
        await self._insert_many(
            f"INSERT INTO push_outbox ({self._columns()}{OUTBOX_COLUMNS}) VALUES ({marks})",
            [(*self._key(), *outbox_row(n)) for n in notifications],
        )

    async def claim(
        self, now_ms: int, lease_until_ms: int, limit: int, skip: Sequence[str] = ()
    ) -> list[Delivery]:
        """Lease up to ``limit`` due rows, each the oldest of its config, oldest due first;
        none of the owners in ``skip`` (those with no room for another attempt)."""
        mark = self._mark
        outer = self._where("o.")
        head = "".join(f"h.{name} = o.{name} AND " for name in self._key_names)
        busy = f"AND o.owner NOT IN ({', '.join([mark] * len(skip))}) " if skip else ""
        rows = await self._query(
            f"UPDATE push_outbox SET lease_ms = {mark} WHERE {self._where()}seq IN ("
            f"SELECT o.seq FROM push_outbox o WHERE {outer}o.next_ms <= {mark} "
            f"AND o.lease_ms <= {mark} {busy}AND o.seq = (SELECT MIN(h.seq) FROM push_outbox h "
            f"WHERE {head}h.task_id = o.task_id AND h.config_id = o.config_id) "
            f"ORDER BY o.next_ms, o.seq LIMIT {mark}) AND lease_ms <= {mark} RETURNING {_CLAIMED}",
            (
                lease_until_ms,
                *self._key(),
                *self._key(),
                now_ms,
                now_ms,
                *skip,
                limit,
                now_ms,
            ),
        )
        return sorted((_delivery(row) for row in rows), key=lambda d: d.seq)

    async def retry_later(self, seq: int, attempts: int, next_ms: int) -> None:
        """Record ``attempts`` on row ``seq``; it is due again at ``next_ms`` (lease ended)."""
        mark = self._mark
        await self._query(
            f"UPDATE push_outbox SET attempts = {mark}, next_ms = {mark}, lease_ms = 0 "
            f"WHERE {self._where()}seq = {mark} RETURNING seq",
            (attempts, next_ms, *self._key(), seq),
        )

    async def release(self, seq: int) -> None:
        """End row ``seq``'s lease without an attempt (it is due again at once)."""
        await self._query(
            f"UPDATE push_outbox SET lease_ms = 0 WHERE {self._where()}seq = {self._mark} "
            "RETURNING seq",
            (*self._key(), seq),
        )

    async def release_all(self) -> None:
        """End every lease (at the start of the one process that uses this store)."""
        where = self._where().removesuffix("AND ")
        await self._query(
            f"UPDATE push_outbox SET lease_ms = 0 {f'WHERE {where} ' if where else ''}"
            "RETURNING seq",
            self._key(),
        )

    async def finish(self, seq: int) -> None:
        """Remove row ``seq``: delivered, or given up."""
        await self._query(
            f"DELETE FROM push_outbox WHERE {self._where()}seq = {self._mark} RETURNING seq",
            (*self._key(), seq),
        )

    async def pending_by_owner(self) -> dict[str, int]:
        """How many rows wait in the outbox, per owner."""
        where = self._where().removesuffix("AND ")
        rows = await self._query(
            f"SELECT owner, COUNT(*) FROM push_outbox {f'WHERE {where} ' if where else ''}"
            "GROUP BY owner",
            self._key(),
        )
        return {str(row[0]): int(row[1]) for row in rows}

    async def prune(self, before_ms: int) -> int:
        """Delete the configs made before ``before_ms`` (their tasks are past retention too)
        and the outbox rows queued before it; returns how many configs."""
        mark = self._mark
        pruned = await self._query(
            f"DELETE FROM push_configs WHERE {self._where()}created_ms < {mark} RETURNING seq",
            (*self._key(), before_ms),
        )
        await self._query(
            f"DELETE FROM push_outbox WHERE {self._where()}created_ms < {mark} RETURNING seq",
            (*self._key(), before_ms),
        )
        return len(pruned)

    def _columns(self) -> str:
        return "".join(f"{name}, " for name in self._key_names)

    def _where(self, alias: str = "") -> str:
        return "".join(f"{alias}{name} = {self._mark} AND " for name in self._key_names)


def _config_row(config: PushConfig) -> tuple[object, ...]:
    c = config
    return (
        c.task_id,
        c.config_id,
        c.owner,
        c.url,
        c.token,
        c.auth_scheme,
        c.auth_credentials,
        c.created_ms,
    )


def _config(row: tuple[Any, ...]) -> PushConfig:
    return PushConfig(
        task_id=str(row[0]),
        config_id=str(row[1]),
        owner=str(row[2]),
        url=str(row[3]),
        token=str(row[4]),
        auth_scheme=str(row[5]),
        auth_credentials=str(row[6]),
        created_ms=int(row[7]),
    )


def _delivery(row: tuple[Any, ...]) -> Delivery:
    notification = Notification(
        owner=str(row[1]),
        task_id=str(row[2]),
        config_id=str(row[3]),
        notification_id=str(row[4]),
        body=bytes(row[5]),
        created_ms=int(row[7]),
    )
    return Delivery(seq=int(row[0]), notification=notification, attempts=int(row[6]))
