"""The plan part of ``a2a-gateway demo``: one plan, run locally and on two peers.

bob and carol both offer ``text.summarize`` and ``notes.archive`` to alice;
alice's outbound rules let bob receive only ``text.summarize``, so the archive
step is refused for bob by policy and rerouted to carol. The summary is
verified: it runs on two sources at once and their outputs are compared.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field

from capabilities.context import CallContext
from capabilities.contract import ContractModel
from capabilities.registry import Capability, CapabilityRegistry, capability
from gateway.plans.document.model import Plan
from gateway.plans.execution.step_events import StepEvent
from gateway.runtime.agent import Agent


class SummarizeInput(ContractModel):
    """Text to summarise."""

    text: str = Field(max_length=4096)


class SummarizeOutput(ContractModel):
    """A one-line summary."""

    summary: str
    words: int = Field(ge=0)


class ArchiveInput(ContractModel):
    """A note to archive."""

    title: str = Field(max_length=256)
    body: str = Field(max_length=4096)


class ArchiveOutput(ContractModel):
    """Where the note went."""

    archive_id: str


def demo_capabilities() -> list[Capability]:
    """``text.summarize`` (read) and ``notes.archive`` (write, idempotent)."""

    @capability("text.summarize", "1.0.0", risk="read", timeout=2.0, idempotent=True)
    async def summarize(inp: SummarizeInput, ctx: CallContext) -> SummarizeOutput:
        """Summarise text in one line."""
        words = inp.text.split()
        return SummarizeOutput(summary=" ".join(words[:6]).lower(), words=len(words))

    @capability("notes.archive", "1.0.0", risk="write", timeout=2.0, idempotent=True)
    async def archive(inp: ArchiveInput, ctx: CallContext) -> ArchiveOutput:
        """Archive a note; returns its archive id."""
        digest = hashlib.sha256(f"{inp.title}\n{inp.body}".encode()).hexdigest()
        return ArchiveOutput(archive_id=f"note-{digest[:8]}")

    return [summarize, archive]


def register_demo_capabilities(registry: CapabilityRegistry) -> CapabilityRegistry:
    """Add the demo capabilities to ``registry``; returns it."""
    for cap in demo_capabilities():
        registry.register(cap)
    return registry


DEMO_GRANTED = ["text.summarize", "notes.archive"]
"""What bob and carol let alice call (besides the core demo's grants)."""

DEMO_OUTBOUND = {"bob": ["text.summarize"], "carol": ["text.summarize", "notes.archive"]}
"""alice's outbound rules: which peer may receive which capability."""

DEMO_PLAN: dict[str, Any] = {
    "goal": "find the note about tamper-evident logs, summarise it, archive the summary",
    "max_parallel": 2,
    "max_risk": "write",
    "budget": {"max_steps": 6, "max_peer_calls": 6, "max_elapsed_seconds": 10},
    "steps": [
        {
            "id": "search",
            "capability": "text.search",
            "version": "^1",
            "input": {"query": "tamper evident audit", "limit": 1},
        },
        {
            "id": "summarize",
            "capability": "text.summarize",
            "depends_on": ["search"],
            "input": {"text": {"$from": "search.items.0.title"}},
            "verify": {"quorum": 2},
        },
        {
            "id": "archive",
            "capability": "notes.archive",
            "depends_on": ["search", "summarize"],
            "input": {
                "title": {"$from": "search.items.0.title"},
                "body": {"$from": "summarize.summary"},
            },
            "expect": {"schema": {"type": "object", "required": ["archive_id"]}},
        },
    ],
}


async def run_plan_demo(alice: Agent, names: dict[str, str]) -> bool:
    """Run ``DEMO_PLAN`` on alice; print where each step ran. True if it completed."""
    print("\nA plan run by alice: steps go local first, else to a peer her policy allows")

    def show(event: StepEvent) -> None:
        if event.status != "started":
            where = names.get(event.where, event.where)
            print(
                f"  {event.step_id:<10} {event.status:<10} on {where:<6} {event.duration_ms:6.1f}ms"
            )

    result = await alice.run(Plan.model_validate(DEMO_PLAN), on_event=show)
    print(
        f"  task {result.task_id}: {result.state.value} ({result.reason}), "
        f"confidence {result.confidence.value}"
    )
    for step in result.steps.values():
        where = names.get(step.where, step.where)
        version = step.evidence.served_version if step.evidence else "?"
        digest = step.evidence.sha256[:12] if step.evidence else "-"
        print(
            f"  {step.step_id:<10} ran on {where:<6} v{version:<6} sha256:{digest}"
            f"  {step.confidence.value}"
        )
        if len(step.sources) > 1:
            agreeing = ", ".join(names.get(e.where, e.where) for e in step.sources)
            print(f"  {'':<10} {len(step.sources)} sources agree: {agreeing}")
        for note in step.notes:
            peer, _, why = note.partition(": ")
            print(f"  {'':<10} {names.get(peer, peer)} refused: {why} → rerouted")
    return result.ok
