"""An upstream's listed skills, as ordinary local capabilities.

Each ``[[upstreams.skills]]`` entry becomes a ``Capability`` in the agent's
registry, so grants, payload caps, Describe, the A2A card, plans and the audit
log treat it like any other: the decision path has admitted and validated the
input before the handler below runs, and the capability runner checks its
output against the contract and digests it.

What is sent, per skill:

* with ``accepts``: every part of the caller's A2A message, as it came (the
  first data part as ``input_schema`` validated it, when the skill has one);
  a call that came without a message (Invoke, a plan step) sends its input
  object as one data part;
* without: the text as one text part, or with ``input_schema`` the validated
  object (only the fields the schema declares and the caller set) as one
  ``data`` part.

What comes back:

* with ``gives``: the upstream's answer as it gave it, a Message as a
  ``MessageReply``, a completed task as a ``TaskReply`` (its artifacts, its
  final status text); each part checked, data parts against ``output_schema``
  when the skill has one;
* without: ``{"text": ...}``, the answer's text parts joined, or with
  ``output_schema`` the answer's first ``data`` part.

Every message keeps the caller's ``message_id`` (``upstream_ids``). An upstream
task that waits for its caller (``INPUT_REQUIRED``/``AUTH_REQUIRED``) is passed
on when the skill asks its caller (``asks_input``; by default a skill with
``accepts`` or ``gives``): the caller's task waits in that state with the
upstream's question, and the caller's next message on it goes to the same
upstream task, for as long as the skill's timeout lasts. A call that cannot
pass the question on (an Invoke, or a skill that does not ask) fails, and the
upstream task is cancelled; so is one left waiting when the call ends
otherwise (cancelled, timed out). Nothing of the caller's message but its
parts and id is sent: no metadata (only ``a2agw.skill``), no identity, no push
notification config.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from capabilities.context import CallContext
from capabilities.contract import Accepts, CapabilityContract, ContractModel, Gives
from capabilities.parts import (
    AnyObject,
    Artifact,
    DataPart,
    MessageReply,
    Part,
    TaskReply,
    TextPart,
)
from capabilities.registry import Capability, CapabilityRegistry, DuplicateCapability, Handler
from capabilities.schema_models import contract_model
from capabilities.versions import Version
from gateway.client.a2a.upstream_answers import UnreadableAnswer
from gateway.client.a2a.upstream_client import UpstreamClient, UpstreamFailed
from gateway.client.a2a.upstream_parts import first_data, joined_text
from gateway.client.a2a.upstream_replies import UpstreamAnswer
from gateway.config import UpstreamSkill
from gateway.errors import AgentConfigError
from gateway.transport.a2a.json_numbers import restore_integers

_log = logging.getLogger(__name__)
_NO_TIME = 0.001
"""The least timeout one send gets (the runner's own timeout ends the call anyway)."""


class TextInput(ContractModel):
    """The default input: one text, sent as one text part."""

    text: str = Field(max_length=1_000_000)


class TextOutput(ContractModel):
    """The default output: the answer's text parts, joined."""

    text: str


def upstream_capability(skill: UpstreamSkill, client: UpstreamClient) -> Capability:
    """The capability serving ``skill`` through ``client``."""
    passes_in = skill.accepts is not None
    passes_out = skill.gives is not None
    input_model = _model(skill, "Input", skill.input_schema, AnyObject if passes_in else TextInput)
    output_model = _model(
        skill, "Output", skill.output_schema, AnyObject if passes_out else TextOutput
    )
    contract = CapabilityContract(
        name=skill.capability,
        version=Version.parse(skill.version),
        risk=skill.risk,
        timeout_seconds=skill.timeout,
        idempotent=skill.idempotent,
        input_model=input_model,
        output_model=output_model,
        description=skill.description or f"A2A skill {skill.skill!r} of an upstream agent",
        accepts=_accepts(skill),
        gives=skill.gives.contract() if skill.gives is not None else Gives(),
        asks_input=skill.asks_caller,
    )
    return Capability(contract, _handler(skill, client, output_model), upstream=client.name)


def register_upstreams(registry: CapabilityRegistry, clients: Sequence[UpstreamClient]) -> None:
    """Register each upstream's listed skills; AgentConfigError (naming the key) on a clash."""
    for index, client in enumerate(clients):
        for number, skill in enumerate(client.entry.skills):
            try:
                registry.register(upstream_capability(skill, client))
            except DuplicateCapability as err:
                raise AgentConfigError(
                    f"upstreams[{index}].skills[{number}].capability: {err}"
                ) from err


def _accepts(skill: UpstreamSkill) -> Accepts:
    if skill.accepts is not None:
        return skill.accepts.contract()
    # A text skill takes text anyway (its input is {"text"}); saying so lets the
    # caller answer an upstream's question with text too.
    return Accepts(text=skill.input_schema is None)


def _model(
    skill: UpstreamSkill, role: str, schema: dict[str, Any] | None, default: type[BaseModel]
) -> type[BaseModel]:
    if schema is None:
        return default
    name = "".join(word.capitalize() for word in skill.capability.replace("-", "_").split("."))
    return contract_model(f"{name}{role}", schema)


def _handler(
    skill: UpstreamSkill, client: UpstreamClient, output_model: type[BaseModel]
) -> Handler:
    async def call_upstream(payload: BaseModel, ctx: CallContext) -> Any:
        loop = asyncio.get_running_loop()
        budget = min(skill.timeout, ctx.time_remaining())
        ends = loop.time() + budget
        talk = client.conversation(budget, ctx.peer_id, ctx.context_id)
        parts, message_id = _first_parts(skill, payload, ctx), ctx.message_id
        try:
            while True:
                answer = await client.send(
                    skill.skill,
                    parts,
                    timeout=max(ends - loop.time(), _NO_TIME),
                    events=ctx.events,
                    conversation=talk,
                    message_id=message_id,
                    text_chunks=skill.gives is not None,
                )
                if answer is None:  # not an object: the runner answers INVALID_OUTPUT
                    await client.abandon(talk, None)  # a task a follow-up went to, if any
                    return None
                asks = answer.asks
                if asks is None:
                    return _output(skill, client, answer, output_model)
                if not (skill.asks_caller and ctx.events is not None and ctx.message is not None):
                    raise UpstreamFailed(f"the upstream task waits ({asks}); this call cannot ask")
                reply = await ctx.ask_input(answer.prompt(), state=asks)
                parts, message_id = reply.parts, reply.message_id
        except UnreadableAnswer as err:  # a question or a reply that is no A2A content
            await client.abandon(talk, err)
            _log.warning("upstream %s answered skill %s unreadably", client.name, skill.skill)
            return None
        except BaseException as err:  # cancelled, timed out, failed: leave no task waiting
            await client.abandon(talk, err)
            raise

    return call_upstream


def _first_parts(skill: UpstreamSkill, payload: BaseModel, ctx: CallContext) -> Sequence[Part]:
    """The parts the caller's first message becomes (see the module doc)."""
    if skill.accepts is None:
        if skill.input_schema is None:
            return (TextPart(payload.text),)  # type: ignore[attr-defined]
        return (_data(payload),)
    if ctx.message is None:
        return (_data(payload),)
    if skill.input_schema is None:
        return ctx.parts
    parts = list(ctx.parts)
    for index, part in enumerate(parts):
        if isinstance(part, DataPart):  # the input: as validated, declared fields only
            parts[index] = _data(payload)
            break
    return parts


def _data(payload: BaseModel) -> DataPart:
    # Only what the caller set of the declared fields: nothing else leaves.
    return DataPart(payload.model_dump(mode="json", exclude_unset=True))


def _output(
    skill: UpstreamSkill,
    client: UpstreamClient,
    answer: UpstreamAnswer,
    output_model: type[BaseModel],
) -> Any:
    """What the capability returns for ``answer`` (see the module doc)."""
    if skill.gives is not None:
        reply = answer.reply()
        if skill.output_schema is None:
            return reply
        # google.protobuf.Value carries every number as a double: whole ones become
        # integers where the schema says integer (the runner is strict).
        return _with_integers(reply, output_model)
    wire = answer.wire_parts()
    if skill.output_schema is not None:
        output = restore_integers(first_data(wire), [output_model])
    else:
        output = joined_text(wire)
    if output is None:
        _log.warning(
            "upstream %s answered skill %s without a %s part (%s)",
            client.name,
            skill.skill,
            "data" if skill.output_schema is not None else "text",
            "a skill with output_schema reads the first data part"
            if skill.output_schema is not None
            else "a skill without output_schema reads text parts: declare output_schema "
            "for an answer in a data part",
        )
    return output


def _with_integers(
    reply: TaskReply | MessageReply, output_model: type[BaseModel]
) -> TaskReply | MessageReply:
    def restored(part: Part) -> Part:
        if isinstance(part, DataPart):
            return DataPart(restore_integers(part.data, [output_model]))
        return part

    if isinstance(reply, MessageReply):
        return MessageReply(tuple(map(restored, reply.parts)))
    artifacts = tuple(
        Artifact(tuple(map(restored, a.parts)), a.name, a.description) for a in reply.artifacts
    )
    return TaskReply(artifacts, reply.text)
