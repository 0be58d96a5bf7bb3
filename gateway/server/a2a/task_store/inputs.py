"""Answers to a waiting task that reached another process than the one running it.

With workers or replicas a follow-up message (an answer to ``ctx.ask_input``)
may reach a process that does not run its task. That process admits it
(the whole decision order, against the schema the task asked with) and
leaves it here, ``pending``; the process running the task takes it
(``taken``), or cannot (``refused``: it no longer waits on that question),
each with one conditional update, so exactly one side decides. The sender may
withdraw a pending answer nobody took in time (``withdrawn``). A row holds the
answer's input JSON and its parts' canonical JSON (the caller's own message,
as the task's history does), is read by the owner and id only, and goes once
its sender has read how it ended (and, at the latest, with its task's end).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

PENDING, TAKEN, REFUSED, WITHDRAWN = "pending", "taken", "refused", "withdrawn"
"""How an answer left by another process ended (``a2a_task_inputs.state``)."""
WAITING_STATES = ("input-required", "auth-required")


@dataclass(frozen=True, slots=True)
class PendingInput:
    """An answer another process admitted for a task this process runs.

    Attributes:
        task_id: The task it answers.
        message_id: The answering message's id.
        input: The JSON it became (validated there against the task's schema).
        parts: Its parts' canonical JSON (a list).
    """

    task_id: str
    message_id: str
    input: bytes
    parts: bytes


class TaskInputs(ABC):
    """The ``a2a_task_inputs`` statements of the A2A task store (both backends)."""

    _mark: str
    """The SQL parameter placeholder of the store's driver."""
    _key_names: tuple[str, ...]
    """Names of the key columns besides ``task_id`` (the scope: the agent id, or none)."""

    @abstractmethod
    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of one statement (see ``A2ATaskStore``)."""

    @abstractmethod
    def _scope(self, owner: str) -> tuple[list[str], list[Any]]:
        """The conditions every read of ``owner``'s rows starts with."""

    @abstractmethod
    def _key(self) -> tuple[str, ...]:
        """Values of the key columns besides ``task_id``."""

    @abstractmethod
    def _key_columns(self) -> str:
        """``"col, "`` for each key column besides ``task_id``."""

    @abstractmethod
    def _key_where(self) -> str:
        """``"col = ? AND "`` for each key column besides ``task_id``."""

    async def leave_input(
        self,
        owner: str,
        task_id: str,
        message_id: str,
        input_json: bytes,
        parts: bytes,
        now_ms: int,
    ) -> bool:
        """Leave an admitted answer for the process running ``owner``'s ``task_id``.

        Returns:
            False if an answer with this message id is there already (nothing written).

        Raises:
            StateUnavailable: the store could not be written.
        """
        marks = ", ".join([self._mark] * (len(self._key()) + 7))
        rows = await self._query(
            f"INSERT INTO a2a_task_inputs ({self._key_columns()}task_id, owner, message_id, "
            f"state, input, parts, created_ms) VALUES ({marks}) ON CONFLICT DO NOTHING "
            "RETURNING message_id",
            (*self._key(), task_id, owner, message_id, PENDING, input_json, parts, now_ms),
        )
        return bool(rows)

    async def pending_inputs(self, process_id: str) -> tuple[PendingInput, ...]:
        """The pending answers to tasks process ``process_id`` runs and that wait, oldest first.

        Raises:
            StateUnavailable: the store could not be read.
        """
        mark = self._mark
        same = "".join(f"i.{column} = t.{column} AND " for column in self._key_names)
        mine = "".join(f"i.{column} = {mark} AND " for column in self._key_names)
        rows = await self._query(
            "SELECT i.task_id, i.message_id, i.input, i.parts FROM a2a_task_inputs i "
            f"JOIN a2a_tasks t ON {same}t.task_id = i.task_id AND t.owner = i.owner "
            f"WHERE {mine}t.runner = {mark} AND t.state IN {WAITING_STATES!r} "
            f"AND i.state = {mark} ORDER BY i.created_ms",
            (*self._key(), process_id, PENDING),
        )
        return tuple(PendingInput(str(r[0]), str(r[1]), bytes(r[2]), bytes(r[3])) for r in rows)

    async def end_input(self, task_id: str, message_id: str, state: str) -> bool:
        """End a pending answer as ``state`` (taken, refused, withdrawn).

        Returns:
            False if it had ended already (the other side decided): nothing changed.

        Raises:
            StateUnavailable: the store could not be written.
        """
        mark = self._mark
        rows = await self._query(
            f"UPDATE a2a_task_inputs SET state = {mark} WHERE {self._key_where()}"
            f"task_id = {mark} AND message_id = {mark} AND state = {mark} RETURNING message_id",
            (state, *self._key(), task_id, message_id, PENDING),
        )
        return bool(rows)

    async def input_state(self, owner: str, task_id: str, message_id: str) -> str | None:
        """How ``owner``'s answer ``message_id`` to ``task_id`` is (None: there is none).

        Raises:
            StateUnavailable: the store could not be read.
        """
        where, params = self._scope(owner)
        mark = self._mark
        rows = await self._query(
            f"SELECT state FROM a2a_task_inputs WHERE {' AND '.join(where)} "
            f"AND task_id = {mark} AND message_id = {mark}",
            (*params, task_id, message_id),
        )
        return str(rows[0][0]) if rows else None

    async def forget_input(self, owner: str, task_id: str, message_id: str) -> None:
        """Delete ``owner``'s answer once its sender has read how it ended.

        Raises:
            StateUnavailable: the store could not be written.
        """
        where, params = self._scope(owner)
        mark = self._mark
        await self._query(
            f"DELETE FROM a2a_task_inputs WHERE {' AND '.join(where)} "
            f"AND task_id = {mark} AND message_id = {mark} RETURNING message_id",
            (*params, task_id, message_id),
        )
