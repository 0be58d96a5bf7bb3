"""The A2A tasks this agent answered, per owner, in SQLite under ``state_dir``.

Every SendMessage that passes the pipeline becomes one task. A blocking one is
written once when it ends (the call runs inside SendMessage, so no one can see
it earlier), by a background writer that commits in batches, like the audit
log's allowed records; every read waits for that queue first. A background or
streamed task (:mod:`gateway.server.a2a.background_tasks`) is written with
:meth:`A2ATaskStore.save` at once, before its id is answered, and again at
each change of state; a finished task never changes again (the update is
conditional on the stored state), so a late write cannot undo an end.
Unfinished rows name the process running them (the ``runner`` column) and carry a lease
it renews; ``fail_orphans`` ends those of a process that is gone. With other
processes sharing the store, a running task's output chunks are kept as well
(``a2a_task_chunks``, numbered from 0, each its canonical JSON), for a follower
in another process; they are dropped once the task has ended (its output
holds them all) and by ``prune``.
Every read names the owner and the user the task was started for (the
subject and issuer of a verified ``A2AGW-User-Token``, never the token; two
empty strings for none): a task of another peer, or of another user of the
same peer, is never returned, and the query for it is the same query as for
an id that never existed. Rows written before the user columns existed read
as started for no user. WAL with
``synchronous=NORMAL``: tasks survive a restart (``flush`` on stop); a crash
may lose the tasks of the last few milliseconds, as it may their allowed audit
records. The output is the caller's own answer, kept for
GetTask; nothing here is logged.

A page token names the last task of its page, one of the caller's own, in
base64url; the next page is the owner's tasks listed after that one. Tasks are
listed by last update, newest first, as the A2A spec requires (ties: ``seq``,
newest first); the token's task is placed where it is when the next page is
asked for, so a task updated while a client pages (the token's own too) moves
to the top of the listing. It holds
no row number or count, so paging reveals nothing of other peers' tasks, and
it is resolved only among the caller's own tasks for the same user: another
owner's or user's token (or a forged one) is refused exactly as garbage is.
Tokens need no key, so they hold across restarts and replicas.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.errors import InvalidRequest
from gateway.inbound.call import REQUEST_ID
from gateway.inbound.invoke_handler import NO_USER
from gateway.server.a2a.task_store.inputs import WAITING_STATES, TaskInputs
from gateway.sql.dialect import Dialect

_log = logging.getLogger(__name__)

MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
_MAX_TOKEN_CHARS = 256
_BAD_TOKEN = "page_token is not a token this agent handed out to this caller"
GATHER_SECONDS = 0.01
"""How long a finished task waits for others to share its write (reads write it at once)."""
CHUNKS_PER_STATEMENT = 200
"""Chunk rows written or read by one statement (well under SQLite's parameter limit)."""

TASK_COLUMNS = (
    "task_id, owner, context_id, state, capability, served_version, output, "
    "evidence_sha256, replayed, reason, message, created_ms, updated_ms, status_json, history, "
    "asked_schema, on_behalf_of, user_issuer"
)
"""The task columns of ``a2a_tasks`` in ``A2ATask`` field order (both stores)."""
_USER_COLUMNS = ("on_behalf_of", "user_issuer")
"""The user a task was started for: written with its first row, never changed."""
TaskUser = tuple[str, str]
"""(subject, issuer) of the verified user a task was started for; ``NO_USER``: none."""
UNFINISHED = ("submitted", "working", "input-required", "auth-required")
"""The states of a task that has not ended (``TaskOutcome`` values)."""
WAITING = WAITING_STATES
"""The states of a task that waits for its caller's next message (``TaskOutcome`` values)."""


Scope = tuple[list[str], list[Any]]
"""SQL conditions and their parameter values (a method named ``list`` shadows the type)."""


class TaskOutcome(StrEnum):
    """A task's state: how it ended, or (background and streamed tasks) that it has not yet."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    AUTH_REQUIRED = "auth-required"

    @property
    def finished(self) -> bool:
        """True once the task has ended (it never changes again)."""
        return self.value not in UNFINISHED

    @property
    def waiting(self) -> bool:
        """True while the task waits for its caller (``ctx.ask_input``): an interrupted state."""
        return self.value in WAITING


@dataclass(frozen=True, slots=True)
class A2ATask:
    """One task (finished, or a background task's latest state).

    Attributes:
        task_id: Server-chosen id.
        owner: SPIFFE ID of the peer that sent the message.
        context_id: The message's context id (or one chosen for it).
        state: How it ended (or that it has not yet).
        capability: The capability it called.
        served_version: The version that ran ("" if none was chosen).
        output: Output JSON bytes (completed tasks).
        evidence_sha256: Digest of the output.
        remembered: The answer came from the idempotency store (column ``replayed``).
        reason: ``OK`` or the failure's reason code.
        message: The failure's message (never payload content); while the task runs,
            its latest progress text (``ctx.report_progress``).
        created_ms: Unix ms when the message arrived.
        updated_ms: Unix ms of its latest change (when it ended, once it has).
        status_json: The status message when it is more than ``message``'s text
            (a ``ctx.ask_input`` prompt, a reply's message): canonical JSON
            ``{"message_id", "parts"}`` (:mod:`capabilities.replies` part forms);
            empty otherwise.
        history: The task's messages, oldest first, for a capability that asks
            for input (canonical JSON list of ``{"role", "message_id", "parts"}``,
            bounded: ``gateway.server.a2a.history``); empty for other tasks,
            whose input is not kept.
        asked_schema: While it waits: ``module:qualname`` of the model its answer
            is validated against ("" for none: any message; ``?`` for a model
            no other process can name), so another process can admit an answer.
        on_behalf_of: The subject of the verified user the task was started for
            (``A2AGW-User-Token``); "" for none. Never a token.
        user_issuer: The issuer that vouched for that user ("" for none).
    """

    task_id: str
    owner: str
    context_id: str
    state: TaskOutcome
    capability: str
    served_version: str
    output: bytes
    evidence_sha256: str
    remembered: bool
    reason: str
    message: str
    created_ms: int
    updated_ms: int
    status_json: bytes = b""
    history: bytes = b""
    asked_schema: str = ""
    on_behalf_of: str = ""
    user_issuer: str = ""

    @property
    def user(self) -> TaskUser:
        """(subject, issuer) of the user the task was started for (``NO_USER``: none)."""
        return self.on_behalf_of, self.user_issuer


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """What ListTasks asks for, besides its owner (all optional)."""

    context_id: str = ""
    state: TaskOutcome | None = None
    updated_after_ms: int = 0
    page_size: int = DEFAULT_PAGE_SIZE
    page_token: str = ""


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of ListTasks, last updated first."""

    tasks: list[A2ATask]
    next_page_token: str
    total_size: int
    page_size: int = DEFAULT_PAGE_SIZE
    """The page size used (the one asked for, clamped), however many tasks the page holds."""


class A2ATaskStore(TaskInputs, ABC):
    """Finished (and background) A2A tasks; safe to share between threads.

    The interface of every backend and the statements they share, written
    once over a :class:`~gateway.sql.dialect.Dialect`
    (:class:`~gateway.server.a2a.task_store.sqlite.SqliteA2ATaskStore`,
    :class:`~gateway.server.a2a.task_store.postgres.PostgresA2ATaskStore`
    run them on their connection).
    Invariants every implementation keeps: every read waits for this
    process's queued tasks first; a read names the owner and the user, so
    another peer's (or user's) task is the same empty answer as an id that
    never existed; ``updated_ms``
    then ``seq`` order tasks newest first, and the page token names a task; an
    unreadable store raises
    :class:`~gateway.errors.StateUnavailable`, a batch that cannot be written
    is logged by its size (its calls were answered already).

    Args:
        sql: The backend's dialect.
        scope: The values of ``sql.scope`` (the agent id in a shared table).
    """

    def __init__(self, sql: Dialect, scope: tuple[str, ...] = ()) -> None:
        self._mark = sql.mark
        self._key_names = sql.scope
        self._scope_values = scope
        self._insert = (
            f"INSERT INTO a2a_tasks ({sql.columns(TASK_COLUMNS)}) "
            f"VALUES ({sql.marks(len(sql.scope) + len(TASK_COLUMNS.split(', ')))})"
        )
        """Inserts one finished task (:meth:`put`'s batches), scope values first."""
        self._pending: list[A2ATask] = []
        self._writer: asyncio.Task[None] | None = None
        self._gathering: asyncio.TimerHandle | None = None

    @abstractmethod
    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of one statement, run in a thread; StateUnavailable if it fails."""

    @abstractmethod
    async def _drain(self) -> None:
        """Write the queued tasks in batches until none is left (log a failed batch)."""

    def put(self, task: A2ATask) -> None:
        """Queue a finished task; a background writer commits queued tasks in batches.

        A task queued while no batch is being written waits ``GATHER_SECONDS``
        for others to join its batch: one at a time, each call paid a thread
        hand-off and a commit of its own. Reads (``get``, ``list``) flush the
        queue first, so a caller sees its task as soon as SendMessage has answered.
        """
        self._pending.append(task)
        if self._gathering is None and (self._writer is None or self._writer.done()):
            loop = asyncio.get_running_loop()
            self._gathering = loop.call_later(GATHER_SECONDS, self._write_now)

    def _write_now(self) -> None:
        """Start writing the queued tasks, unless a writer already is."""
        if self._gathering is not None:
            self._gathering.cancel()
            self._gathering = None
        if self._pending and (self._writer is None or self._writer.done()):
            self._writer = asyncio.create_task(self._drain())

    async def flush(self) -> None:
        """Wait until every queued task is committed (or its batch failed and was logged)."""
        self._write_now()
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def get(
        self, owner: str, task_id: str, user: TaskUser | None = NO_USER
    ) -> A2ATask | None:
        """``owner``'s task ``task_id`` started for ``user``; None if there is none (whoever
        else's it might be: another caller's, or another user's of this caller).

        ``user`` None reads the task whoever it was started for: only for a reader that
        compares the user itself once it is verified (a follow-up, read before its
        admission verifies its tokens).

        Raises:
            StateUnavailable: the store could not be read (a shared database).
        """
        await self.flush()
        if not REQUEST_ID.fullmatch(task_id):  # never an id this store made (nor a query's text)
            return None
        where, params = self._task_scope(owner, user)
        rows = await self._query(
            f"SELECT {TASK_COLUMNS} FROM a2a_tasks WHERE {' AND '.join(where)} "
            f"AND task_id = {self._mark}",
            (*params, task_id),
        )
        return task_from_row(rows[0]) if rows else None

    async def list(self, owner: str, wanted: TaskFilter, user: TaskUser = NO_USER) -> TaskPage:
        """A page of ``owner``'s tasks started for ``user``, last updated first (the A2A
        spec's order; ties: newest first).

        Raises:
            InvalidRequest: the page token is not one this store handed out.
            StateUnavailable: the store could not be read (a shared database).
        """
        await self.flush()
        mark = self._mark
        where, params = self._task_scope(owner, user)
        if wanted.context_id:
            where.append(f"context_id = {mark}")
            params.append(wanted.context_id)
        if wanted.state is not None:
            where.append(f"state = {mark}")
            params.append(wanted.state.value)
        if wanted.updated_after_ms:
            where.append(f"updated_ms >= {mark}")
            params.append(wanted.updated_after_ms)
        condition = " AND ".join(where)
        total = await self._query(f"SELECT COUNT(*) FROM a2a_tasks WHERE {condition}", (*params,))
        page_where, page_params = condition, list(params)
        if wanted.page_token:  # the tasks listed after the token's task, in the order below
            updated_ms, seq = await self._cursor(owner, user, wanted.page_token)
            page_where += f" AND (updated_ms < {mark} OR (updated_ms = {mark} AND seq < {mark}))"
            page_params += [updated_ms, updated_ms, seq]
        size = page_size(wanted)
        rows = await self._query(  # the spec's order: last updated first (ties: newest first)
            f"SELECT {TASK_COLUMNS}, seq FROM a2a_tasks WHERE {page_where} "
            f"ORDER BY updated_ms DESC, seq DESC LIMIT {mark}",
            (*page_params, size + 1),
        )
        more = len(rows) > size
        rows = rows[:size]
        tasks = [task_from_row(row[:-1]) for row in rows]
        token = page_token(tasks[-1].task_id) if more and tasks else ""
        return TaskPage(tasks, token, int(total[0][0]), size)

    async def _cursor(self, owner: str, user: TaskUser, token: str) -> tuple[int, int]:
        """Where the page after ``token`` starts: (last update, row order) of the owner's
        task (started for ``user``) it names, as that task is now."""
        where, params = self._task_scope(owner, user)
        rows = await self._query(
            f"SELECT updated_ms, seq FROM a2a_tasks WHERE {' AND '.join(where)} "
            f"AND task_id = {self._mark}",
            (*params, token_task_id(token)),
        )
        if not rows:
            raise InvalidRequest(_BAD_TOKEN)
        return int(rows[0][0]), int(rows[0][1])

    def _scope(self, owner: str) -> Scope:
        """The conditions (and their values) every read of ``owner``'s tasks starts with."""
        names = (*self._key_names, "owner")
        return [f"{name} = {self._mark}" for name in names], [*self._scope_values, owner]

    def _task_scope(self, owner: str, user: TaskUser | None) -> Scope:
        """``_scope`` of a read of ``a2a_tasks``, narrowed to the tasks started for ``user``
        (None: whoever they were started for)."""
        where, params = self._scope(owner)
        if user is not None:
            where += [f"{column} = {self._mark}" for column in _USER_COLUMNS]
            params += list(user)
        return where, params

    # --- background and streamed tasks (see gateway.server.a2a.background_tasks) ---

    async def save(self, task: A2ATask, process_id: str = "", lease_ms: int = 0) -> bool:
        """Write ``task`` now (insert, or update its row unless that row has ended).

        Args:
            task: The task's new state.
            process_id: The process running it (``BackgroundTasks.process_id``) while unfinished.
            lease_ms: Unix ms until which that process vouches for it.

        Returns:
            False if the stored task had already ended (nothing changed).

        Raises:
            StateUnavailable: the store could not be written.
        """
        marks = ", ".join([self._mark] * (len(task_row(task)) + 2 + len(self._key())))
        finished = ", ".join(f"'{state.value}'" for state in TaskOutcome if state.finished)
        updates = ", ".join(
            f"{column} = excluded.{column}"
            for column in (*TASK_COLUMNS.split(", ")[3:], "runner", "lease_ms")
            if column not in _USER_COLUMNS  # a task's user never changes
        )
        rows = await self._query(
            f"INSERT INTO a2a_tasks ({self._key_columns()}{TASK_COLUMNS}, runner, lease_ms) "
            f"VALUES ({marks}) ON CONFLICT ({self._key_columns()}task_id) DO UPDATE SET "
            f"{updates} WHERE a2a_tasks.state NOT IN ({finished}) RETURNING task_id",
            (*self._key(), *task_row(task), process_id, lease_ms),
        )
        return bool(rows)

    async def forget(self, owner: str, task_id: str) -> None:
        """Delete ``owner``'s task ``task_id`` and its chunks (a call answered with a Message
        keeps no task).

        Raises:
            StateUnavailable: the store could not be written.
        """
        await self.flush()
        where, params = self._scope(owner)
        await self._query(
            f"DELETE FROM a2a_tasks WHERE {' AND '.join(where)} AND task_id = {self._mark} "
            "RETURNING task_id",
            (*params, task_id),
        )
        await self.drop_chunks(task_id)

    async def renew_leases(self, process_id: str, lease_ms: int) -> None:
        """Extend the lease of every unfinished task process ``process_id`` runs to ``lease_ms``."""
        mark = self._mark
        await self._query(
            f"UPDATE a2a_tasks SET lease_ms = {mark} WHERE {self._key_where()}runner = {mark} "
            f"AND state IN {UNFINISHED!r} RETURNING task_id",
            (lease_ms, *self._key(), process_id),
        )

    async def fail_orphans(
        self, process_id: str, now_ms: int, reason: str, message: str, *, any_lease: bool
    ) -> tuple[A2ATask, ...]:
        """End as FAILED the unfinished tasks no live process runs; returns them.

        A task is orphaned when another process holds it and its lease has
        passed, or (``any_lease``: no other process can be running tasks of
        this store, e.g. at the start of a lone process) whatever its lease.
        """
        mark = self._mark
        lease = "" if any_lease else f" AND lease_ms < {mark}"
        rows = await self._query(
            f"UPDATE a2a_tasks SET state = 'failed', reason = {mark}, message = {mark}, "
            f"updated_ms = {mark}, runner = '' WHERE {self._key_where()}state IN {UNFINISHED!r} "
            f"AND runner <> {mark}{lease} RETURNING {TASK_COLUMNS}",
            (reason, message, now_ms, *self._key(), process_id, *(() if any_lease else (now_ms,))),
        )
        return tuple(task_from_row(row) for row in rows)

    async def request_cancel(self, owner: str, task_id: str, canceller: str) -> bool:
        """Ask the process running ``owner``'s unfinished task to cancel it for ``canceller``.

        Returns:
            False if it has no such unfinished task (nothing changed).
        """
        mark = self._mark
        where, params = self._scope(owner)
        rows = await self._query(
            f"UPDATE a2a_tasks SET cancel_by = {mark} WHERE {' AND '.join(where)} "
            f"AND task_id = {mark} AND state IN {UNFINISHED!r} RETURNING task_id",
            (canceller, *params, task_id),
        )
        return bool(rows)

    async def cancel_requests(self, process_id: str) -> tuple[tuple[str, str], ...]:
        """(task id, canceller) of ``process_id``'s unfinished tasks that another
        process asked to cancel."""
        mark = self._mark
        rows = await self._query(
            f"SELECT task_id, cancel_by FROM a2a_tasks WHERE {self._key_where()}"
            f"runner = {mark} AND state IN {UNFINISHED!r} AND cancel_by <> ''",
            (*self._key(), process_id),
        )
        return tuple((str(row[0]), str(row[1])) for row in rows)

    async def prune(self, before_ms: int) -> int:
        """Delete the finished tasks that last changed before ``before_ms``, and the chunks
        and left answers of every task that is not running (ended, or gone); returns how
        many tasks."""
        await self.flush()
        mark = self._mark
        rows = await self._query(
            f"DELETE FROM a2a_tasks WHERE {self._key_where()}state NOT IN {UNFINISHED!r} "
            f"AND updated_ms < {mark} RETURNING task_id",
            (*self._key(), before_ms),
        )
        for table, column in (("a2a_task_chunks", "n"), ("a2a_task_inputs", "message_id")):
            await self._query(  # kept only while their task runs
                f"DELETE FROM {table} WHERE {self._key_where()}task_id NOT IN "
                f"(SELECT task_id FROM a2a_tasks WHERE {self._key_where()}state IN "
                f"{UNFINISHED!r}) RETURNING {column}",
                (*self._key(), *self._key()),
            )
        return len(rows)

    async def add_chunks(
        self, owner: str, task_id: str, first: int, chunks: Sequence[bytes]
    ) -> None:
        """Keep ``chunks`` (canonical JSON objects) of a running task, numbered from ``first``.

        A number already kept is left as it is (a retried save writes nothing twice).

        Raises:
            StateUnavailable: the store could not be written.
        """
        mark = self._mark
        row = f"({', '.join([mark] * (len(self._key()) + 4))})"
        for start in range(0, len(chunks), CHUNKS_PER_STATEMENT):
            batch = chunks[start : start + CHUNKS_PER_STATEMENT]
            params = [
                value
                for n, chunk in enumerate(batch, first + start)
                for value in (*self._key(), task_id, owner, n, chunk)
            ]
            await self._query(
                f"INSERT INTO a2a_task_chunks ({self._key_columns()}task_id, owner, n, chunk) "
                f"VALUES {', '.join([row] * len(batch))} "
                f"ON CONFLICT ({self._key_columns()}task_id, n) DO NOTHING RETURNING n",
                tuple(params),
            )

    async def chunks_from(self, owner: str, task_id: str, first: int) -> tuple[bytes, ...]:
        """``owner``'s kept chunks of ``task_id`` numbered ``first`` on, in order (at most
        ``CHUNKS_PER_STATEMENT``); none for another owner's task.

        Raises:
            StateUnavailable: the store could not be read.
        """
        where, params = self._scope(owner)
        mark = self._mark
        rows = await self._query(
            f"SELECT chunk FROM a2a_task_chunks WHERE {' AND '.join(where)} "
            f"AND task_id = {mark} AND n >= {mark} ORDER BY n LIMIT {CHUNKS_PER_STATEMENT}",
            (*params, task_id, first),
        )
        return tuple(bytes(row[0]) for row in rows)

    async def chunk_count(self, owner: str, task_id: str) -> int:
        """How many chunks of ``owner``'s ``task_id`` are kept (the next one's number).

        Raises:
            StateUnavailable: the store could not be read.
        """
        where, params = self._scope(owner)
        rows = await self._query(
            f"SELECT COALESCE(MAX(n) + 1, 0) FROM a2a_task_chunks WHERE {' AND '.join(where)} "
            f"AND task_id = {self._mark}",
            (*params, task_id),
        )
        return int(rows[0][0])

    async def drop_chunks(self, task_id: str) -> None:
        """Forget the kept chunks of ``task_id`` (it has ended: its output holds them).

        Raises:
            StateUnavailable: the store could not be written.
        """
        await self._query(
            f"DELETE FROM a2a_task_chunks WHERE {self._key_where()}task_id = {self._mark} "
            "RETURNING n",
            (*self._key(), task_id),
        )

    def _key(self) -> tuple[str, ...]:
        """Values of the key columns besides ``task_id`` (the scope)."""
        return self._scope_values

    def _key_columns(self) -> str:
        return "".join(f"{column}, " for column in self._key_names)

    def _key_where(self) -> str:
        return "".join(f"{column} = {self._mark} AND " for column in self._key_names)

    def _rows(self, batch: Sequence[A2ATask]) -> Sequence[tuple[object, ...]]:
        """The values :attr:`_insert` takes for each task of ``batch``."""
        return [(*self._scope_values, *task_row(task)) for task in batch]

    @abstractmethod
    def close(self) -> None:
        """Release the store (``flush`` first: queued tasks are not written here)."""


def page_token(task_id: str) -> str:
    """The opaque token of the page that follows the task ``task_id`` (base64url, no padding)."""
    return base64.urlsafe_b64encode(task_id.encode()).rstrip(b"=").decode()


def token_task_id(token: str) -> str:
    """The task id a page token names (whose it is, the store decides).

    Raises:
        InvalidRequest: the token cannot be one :func:`page_token` made.
    """
    if len(token) > _MAX_TOKEN_CHARS or not token.isascii():
        raise InvalidRequest(_BAD_TOKEN)
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        task_id = raw.decode()
    except (binascii.Error, UnicodeDecodeError) as err:
        raise InvalidRequest(_BAD_TOKEN) from err
    if not REQUEST_ID.fullmatch(task_id) or page_token(task_id) != token:  # one spelling only
        raise InvalidRequest(_BAD_TOKEN)
    return task_id


def page_size(wanted: TaskFilter) -> int:
    """The asked page size, clamped to 1..``MAX_PAGE_SIZE``."""
    return min(max(wanted.page_size, 1), MAX_PAGE_SIZE)


def task_row(task: A2ATask) -> tuple[object, ...]:
    """``task``'s columns in ``A2ATask`` field order (the inverse of :func:`task_from_row`)."""
    return (
        task.task_id,
        task.owner,
        task.context_id,
        task.state.value,
        task.capability,
        task.served_version,
        task.output,
        task.evidence_sha256,
        task.remembered,
        task.reason,
        task.message,
        task.created_ms,
        task.updated_ms,
        task.status_json,
        task.history,
        task.asked_schema,
        task.on_behalf_of,
        task.user_issuer,
    )


def task_from_row(row: tuple[Any, ...]) -> A2ATask:
    """An ``A2ATask`` from a row holding the task's columns in ``A2ATask`` field order."""
    return A2ATask(
        task_id=row[0],
        owner=row[1],
        context_id=row[2],
        state=TaskOutcome(row[3]),
        capability=row[4],
        served_version=row[5],
        output=bytes(row[6] or b""),
        evidence_sha256=row[7],
        remembered=bool(row[8]),
        reason=row[9],
        message=row[10],
        created_ms=row[11],
        updated_ms=row[12],
        status_json=bytes(row[13] or b""),
        history=bytes(row[14] or b""),
        asked_schema=str(row[15] or ""),
        on_behalf_of=str(row[16]),
        user_issuer=str(row[17]),
    )
