"""``text.echo``: returns its input; the cheapest capability, used by benchmarks."""

from __future__ import annotations

from pydantic import Field

from capabilities.context import CallContext
from capabilities.contract import ContractModel, Example
from capabilities.registry import capability


class EchoInput(ContractModel):
    """Text to echo."""

    text: str = Field(max_length=1_000_000)


class EchoOutput(ContractModel):
    """The same text."""

    text: str


@capability(
    "text.echo",
    "1.0.0",
    risk="read",
    timeout=2.0,
    idempotent=True,
    examples=[Example(input={"text": "hi"}, output={"text": "hi"})],
)
async def echo(inp: EchoInput, ctx: CallContext) -> EchoOutput:
    """Return the input text unchanged."""
    return EchoOutput(text=inp.text)
