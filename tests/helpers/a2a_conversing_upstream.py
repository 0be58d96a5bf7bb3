"""A real a2a-sdk agent that converses: it asks for input, answers with any part, records all.

``ConversingAgent`` is an ``AgentExecutor`` served by the SDK's own
``DefaultRequestHandler`` (through ``tests.a2a_upstream``'s servers). It routes
on the text of a message's first text part:

* ``ask QUESTION`` / ``auth QUESTION``: the task waits for input (or
  authorization) with ``QUESTION`` as its status message (``ask`` alone: no
  status message);
* ``reply``: a Message answers, holding every part received;
* anything else (or no text part): the task completes with an artifact
  ``echo`` holding every part received as it came, an artifact ``file`` (a
  file part and a URL part) and the final status message ``done``.

Every message is recorded as it arrived (:class:`Heard`), and every task the
SDK was asked to cancel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus
from google.protobuf import json_format

FILE = Part(raw=b"%PDF-1.7 tck", media_type="application/pdf", filename="answer.pdf")
URL = Part(url="https://example.org/a.txt?k=v", media_type="text/plain", filename="a.txt")


@dataclass(frozen=True)
class Heard:
    """One message as the upstream received it."""

    message_id: str
    continued: bool
    """The message continued an existing task (the SDK fills the message's ids in)."""
    parts: list[dict[str, Any]]
    metadata: dict[str, Any]
    request_metadata: dict[str, Any]
    push_config: bool
    """The request carried a push notification config."""
    served_task: str
    """The task the SDK ran the message in."""
    served_context: str


@dataclass
class ConversingAgent:
    """The executor's record of what reached it (see the module doc)."""

    heard: list[Heard] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def executor(self) -> AgentExecutor:
        return _Executor(self)


class _Executor(AgentExecutor):
    def __init__(self, agent: ConversingAgent) -> None:
        self._agent = agent

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None and context.task_id and context.context_id
        configuration = context.configuration
        self._agent.heard.append(
            Heard(
                message_id=message.message_id,
                continued=context.current_task is not None,
                parts=[json_format.MessageToDict(part) for part in message.parts],
                metadata=json_format.MessageToDict(message.metadata),
                request_metadata=dict(context.metadata or {}),
                push_config=configuration is not None
                and configuration.HasField("task_push_notification_config"),
                served_task=context.task_id,
                served_context=context.context_id,
            )
        )
        texts = [part.text for part in message.parts if part.HasField("text")]
        said = texts[0] if texts else ""
        if said == "reply":
            reply = Message(
                message_id="reply-1", role=Role.ROLE_AGENT, context_id=context.context_id
            )
            for part in message.parts:
                reply.parts.add().CopyFrom(part)
            await event_queue.enqueue_event(reply)
            return
        if context.current_task is None:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                )
            )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        verb, _, question = said.partition(" ")
        if verb in ("ask", "auth"):
            asked = updater.new_agent_message([Part(text=question)]) if question else None
            if verb == "ask":
                await updater.requires_input(asked)
            else:
                await updater.requires_auth(asked)
            return
        await updater.add_artifact(list(message.parts), name="echo", last_chunk=True)
        await updater.add_artifact([FILE, URL], name="file", last_chunk=True)
        await updater.complete(updater.new_agent_message([Part(text="done")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        self._agent.cancelled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()
