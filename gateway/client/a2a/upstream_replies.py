"""An upstream's answer to one message, read as what a fronting capability needs.

The answer is a Message, a completed task, or a task waiting for its caller
(``INPUT_REQUIRED`` / ``AUTH_REQUIRED``); any other end never gets here (the
client raises ``UpstreamFailed``). From it a capability reads:

* :meth:`UpstreamAnswer.asks`: the state a waiting task shows, and
  :meth:`UpstreamAnswer.prompt`: its status message's parts (the question);
* :meth:`UpstreamAnswer.reply`: a Message as a ``MessageReply``; a completed
  task as a ``TaskReply``: its artifacts (name, description, parts) and the
  text of its final status message (that message's other parts, if any, as
  one more artifact named ``status``, so nothing the upstream said is lost);
* :meth:`UpstreamAnswer.wire_parts`: for a skill without ``gives``, the parts
  its output is read from, as before (a message's, else the artifacts', else
  the status message's).

Parts are typed and checked on the way (``upstream_parts``); a reply that is
malformed (an artifact or a message without parts) is ``UnreadableAnswer``.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.types import Part, StreamResponse, TaskState

from capabilities.context import AskState
from capabilities.parts import Artifact, MessageReply, TaskReply, TextPart
from capabilities.parts import Part as TypedPart
from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_parts import MAX_ANSWER_PARTS, typed_parts

ASKS: dict[int, AskState] = {
    TaskState.TASK_STATE_INPUT_REQUIRED: "input-required",
    TaskState.TASK_STATE_AUTH_REQUIRED: "auth-required",
}
"""The upstream task states that wait for the caller, as ``ctx.ask_input`` shows them."""
SILENT_QUESTION = "The agent behind this capability asks for more input."
"""The question shown when a waiting upstream task has no status message."""
MAX_PROMPT_BYTES = 64 * 1024
"""Largest question (its parts' bytes) passed on to a caller."""
STATUS_ARTIFACT = "status"
"""The name of the artifact holding a final status message's parts other than text."""


@dataclass(frozen=True, slots=True)
class UpstreamAnswer:
    """One answer: the upstream's Message, or its task as it ended or waits.

    Attributes:
        event: The answer (a ``message`` or ``task`` stream event).
    """

    event: StreamResponse

    @property
    def task_id(self) -> str:
        """The upstream task's id ("" for a Message)."""
        return self.event.task.id if self.event.HasField("task") else ""

    @property
    def context_id(self) -> str:
        """The context the upstream put the answer in ("" if none)."""
        if self.event.HasField("task"):
            return self.event.task.context_id
        return self.event.message.context_id

    @property
    def asks(self) -> AskState | None:
        """The state the upstream task waits in for its caller; None if it does not."""
        if not self.event.HasField("task"):
            return None
        return ASKS.get(self.event.task.status.state)

    def prompt(self) -> tuple[TypedPart, ...]:
        """The waiting task's question: its status message's parts.

        Raises:
            UnreadableAnswer: a malformed part, or more than ``MAX_PROMPT_BYTES``.
        """
        parts = self.event.task.status.message.parts
        _bounded(len(parts))
        if sum(part.ByteSize() for part in parts) > MAX_PROMPT_BYTES:
            raise UnreadableAnswer(f"the upstream's question exceeds {MAX_PROMPT_BYTES} bytes")
        return typed_parts(parts) or (TextPart(SILENT_QUESTION),)

    def reply(self) -> TaskReply | MessageReply:
        """The answer as a capability's reply (see the module doc).

        Raises:
            UnreadableAnswer: a malformed part, a message or artifact without
                parts, or more than ``MAX_ANSWER_PARTS`` parts.
        """
        try:
            if self.event.HasField("message"):
                _bounded(len(self.event.message.parts))
                return MessageReply(typed_parts(self.event.message.parts))
            task = self.event.task
            _bounded(sum(len(a.parts) for a in task.artifacts) + len(task.status.message.parts))
            artifacts = [
                Artifact(typed_parts(a.parts), a.name, a.description) for a in task.artifacts
            ]
            status = typed_parts(task.status.message.parts)
            text = "".join(part.text for part in status if isinstance(part, TextPart))
            others = tuple(part for part in status if not isinstance(part, TextPart))
            if others:
                artifacts.append(Artifact(others, STATUS_ARTIFACT))
            return TaskReply(tuple(artifacts), text)
        except (ValueError, TypeError) as err:  # a reply value refused what it was given
            raise UnreadableAnswer(f"the upstream's answer is malformed: {err}") from err

    def wire_parts(self) -> list[Part]:
        """The parts a skill without ``gives`` reads its output from (see the module doc)."""
        if self.event.HasField("message"):
            return list(self.event.message.parts)
        task = self.event.task
        parts = [part for artifact in task.artifacts for part in artifact.parts]
        return parts or list(task.status.message.parts)


def _bounded(count: int) -> None:
    if count > MAX_ANSWER_PARTS:
        raise UnreadableAnswer(
            f"the upstream's answer holds {count} parts; at most {MAX_ANSWER_PARTS} are read"
        )
