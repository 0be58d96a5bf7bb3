"""A2A conversations for tests: alice serving the conversation capabilities, one-part messages.

``start_alice`` serves ``Conversations``' capabilities and a ``TaskGate`` to bob and carol;
``message`` builds a SendMessage of one text or data part (a follow-up with ``task_id``);
``ask_trip`` starts the conversation whose first answer is a question.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import A2APeer
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations
from tests.helpers.task_capabilities import TaskGate


async def start_alice(
    pki: Pki, tmp_path: Path, conversations: Conversations, gate: TaskGate | None = None
) -> Agent:
    """alice serving ``conversations`` and ``gate`` to bob (4 KiB payloads) and carol."""
    names = [*CAPABILITIES, "job.run"]
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", names, max_payload_bytes=4096), grant("carol", names)],
    )
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    for cap in conversations.capabilities():
        registry.register(cap)
    for cap in (gate or TaskGate()).capabilities():
        registry.register(cap)
    return await started(agent_config(pki, tmp_path, "alice", policy), registry)


def message(
    capability: str | None = None,
    *,
    text: str | None = None,
    data: dict[str, Any] | None = None,
    task_id: str = "",
    context_id: str = "",
    message_id: str | None = None,
) -> a2a_pb2.SendMessageRequest:
    """A SendMessage of one text or data part (``task_id``: a follow-up)."""
    sent = a2a_pb2.Message(
        message_id=message_id or str(uuid.uuid4()),
        role=a2a_pb2.ROLE_USER,
        task_id=task_id,
        context_id=context_id,
    )
    if capability is not None:
        sent.metadata["a2agw.capability"] = capability
    if text is not None:
        sent.parts.add(text=text)
    if data is not None:
        json_format.ParseDict(data, sent.parts.add().data)
    return a2a_pb2.SendMessageRequest(message=sent)


async def records(agent: Agent) -> list[AuditRecord]:
    """Every record of ``agent``'s audit log, after a flush."""
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


def texts(message_: Any) -> list[str]:
    """The texts of a message's text parts, in order."""
    return [part.text for part in message_.parts if part.WhichOneof("content") == "text"]


async def ask_trip(bob: A2APeer) -> a2a_pb2.Task:
    """bob books a trip; the task waits for his answer to "Where to?"."""
    task = await bob.send(message("trip.book", text="a weekend away"))
    assert task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    return task
