"""docs/a2a-tasks.md: its capability snippet runs and streams as the page says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format

from capabilities.registry import Capability
from gateway.runtime.agent import Agent
from tests.helpers.a2a_grpc import V1, A2APeer, data_request
from tests.helpers.agents import (
    AgentFactory,
    grant,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "a2a-tasks.md"
NOT_RUNNABLE = "<!-- snippet: not-runnable"
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def _fences() -> list[tuple[str, str, bool]]:
    """(language, code, marked not-runnable) of every fenced block of the page."""
    text = DOC.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((match.group(1), match.group(2), before.startswith(NOT_RUNNABLE)))
    return found


def _snippet_capability() -> Capability:
    [code] = [code for lang, code, marked in _fences() if lang == "python" and not marked]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # the page's own code
    summarize = namespace["summarize"]
    assert isinstance(summarize, Capability)
    return summarize


def test_every_snippet_of_the_page_is_run_here_or_marked() -> None:
    fences = _fences()
    unmarked = [lang for lang, _, marked in fences if not marked]
    assert unmarked == ["python"]  # the capability, run below


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    return await make_agent(
        grants=[grant("bob", ["docs.summarize"])], capabilities=[_snippet_capability()]
    )


async def test_the_snippet_streams_progress_chunks_and_its_output(bob: A2APeer) -> None:
    call = bob.stub.SendStreamingMessage(
        data_request("docs.summarize", {"pages": 2}), metadata=V1, timeout=10
    )
    seen = [event async for event in call]
    kinds = [event.WhichOneof("payload") for event in seen]
    assert kinds == ["task"] + ["status_update"] + ["status_update", "artifact_update"] * 2 + [
        "artifact_update",
        "status_update",
    ]
    assert seen[2].status_update.status.message.parts[0].text == "page 1 of 2"
    chunk = json_format.MessageToDict(seen[5].artifact_update.artifact.parts[0].data)
    assert chunk == {"page": 2, "line": "page 2: fine"}
    output = json_format.MessageToDict(seen[6].artifact_update.artifact.parts[0].data)
    assert output == {"text": "page 1: fine; page 2: fine"}
    assert seen[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED
