"""An upstream's listed skills, as ordinary local capabilities.

Each ``[[upstreams.skills]]`` entry becomes a ``Capability`` in the agent's
registry, so grants, payload caps, Describe, the A2A card, plans and the audit
log treat it like any other: the decision path has admitted and validated the
input before the handler below runs, and the capability runner checks its
output against the contract and digests it.

Contracts (both directions) default to ``{"text": string}``:

* input: the text is sent as one text part; with ``input_schema``, the validated
  object (only the fields the schema declares and the caller set) as one
  ``data`` part;
* output: the answer's text parts, joined, become ``{"text": ...}``; with
  ``output_schema``, the answer's first ``data`` part is the output.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from capabilities.context import CallContext
from capabilities.contract import CapabilityContract, ContractModel
from capabilities.registry import Capability, CapabilityRegistry, DuplicateCapability, Handler
from capabilities.schema_models import contract_model
from capabilities.versions import Version
from gateway.client.a2a.upstream_client import UpstreamClient
from gateway.client.a2a.upstream_parts import data_part, first_data, joined_text, text_part
from gateway.config import UpstreamSkill
from gateway.errors import AgentConfigError
from gateway.transport.a2a.json_numbers import restore_integers

_log = logging.getLogger(__name__)


class TextInput(ContractModel):
    """The default input: one text, sent as one text part."""

    text: str = Field(max_length=1_000_000)


class TextOutput(ContractModel):
    """The default output: the answer's text parts, joined."""

    text: str


def upstream_capability(skill: UpstreamSkill, client: UpstreamClient) -> Capability:
    """The capability serving ``skill`` through ``client``."""
    input_model = _model(skill, "Input", skill.input_schema, TextInput)
    output_model = _model(skill, "Output", skill.output_schema, TextOutput)
    contract = CapabilityContract(
        name=skill.capability,
        version=Version.parse(skill.version),
        risk=skill.risk,
        timeout_seconds=skill.timeout,
        idempotent=skill.idempotent,
        input_model=input_model,
        output_model=output_model,
        description=skill.description or f"A2A skill {skill.skill!r} of an upstream agent",
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


def _model(
    skill: UpstreamSkill, role: str, schema: dict[str, Any] | None, default: type[ContractModel]
) -> type[ContractModel]:
    if schema is None:
        return default
    name = "".join(word.capitalize() for word in skill.capability.replace("-", "_").split("."))
    return contract_model(f"{name}{role}", schema)


def _handler(
    skill: UpstreamSkill, client: UpstreamClient, output_model: type[ContractModel]
) -> Handler:
    structured_in = skill.input_schema is not None
    structured_out = skill.output_schema is not None

    async def call_upstream(payload: BaseModel, ctx: CallContext) -> Any:
        parts = [data_part(payload) if structured_in else text_part(payload.text)]  # type: ignore[attr-defined]
        budget = min(skill.timeout, ctx.time_remaining())
        answer = await client.send(skill.skill, parts, timeout=budget, events=ctx.events)
        if answer is None:
            return None  # not an object: the runner answers INVALID_OUTPUT
        if structured_out:
            # google.protobuf.Value carries every number as a double: whole ones
            # become integers where the schema says integer (the runner is strict).
            output = restore_integers(first_data(answer), [output_model])
        else:
            output = joined_text(answer)
        if output is None:
            _log.warning(
                "upstream %s answered skill %s without a %s part (%s)",
                client.name,
                skill.skill,
                "data" if structured_out else "text",
                "a skill with output_schema reads the first data part"
                if structured_out
                else "a skill without output_schema reads text parts: declare output_schema "
                "for an answer in a data part",
            )
        return output

    return call_upstream
