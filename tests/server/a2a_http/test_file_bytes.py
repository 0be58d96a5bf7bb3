"""A file part's bytes on JSON-RPC and HTTP+JSON: base64, or refused before anything runs.

protobuf's JSON parser drops characters outside base64's alphabets, so without
the edge's check ``"raw": "!!!!"`` reached ``doc.words`` as an empty file.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.server.a2a_http.file_bytes import NOT_BASE64, is_base64
from tests.helpers.a2a_conversations import records
from tests.helpers.a2a_http import V1_HEADERS, client_context, jsonrpc, serving_https
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    grant,
    standard_registry,
    started,
    write_policy,
)
from tests.helpers.conversation_capabilities import CAPABILITIES, Conversations


@pytest.mark.parametrize(
    "encoded", ["", "YQ==", "YQ", "YWI=", "YWI", "YWJj", "-_8=", "+/8=", "_-_-"]
)
def test_base64_as_proto3_json_writes_bytes(encoded: str) -> None:
    assert is_base64(encoded)


@pytest.mark.parametrize(
    "encoded", ["!!!!", "Y", "YQ=", "YQ===", "YWJjZ", "a b=", "YQ==YQ==", "YWJj\n", "=", "é"]
)
def test_what_is_not_base64(encoded: str) -> None:
    assert not is_base64(encoded)


@pytest.fixture
async def served(pki: Pki, tmp_path: Path) -> AsyncIterator[tuple[Agent, Conversations]]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", CAPABILITIES)])
    registry = standard_registry(WriteCounter(), tmp_path / "alice-state")
    conversations = Conversations()
    for cap in conversations.capabilities():
        registry.register(cap)
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, registry)
    yield agent, conversations
    await agent.stop()


def _params(part: dict[str, Any]) -> dict[str, Any]:
    return {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "parts": [part],
            "metadata": {"a2agw.capability": "doc.words"},
        }
    }


@pytest.mark.parametrize("raw", ["!!!!", "aGk=!", "a GVsbG8="])
async def test_a_file_part_whose_bytes_are_not_base64_is_refused_and_runs_nothing(
    pki: Pki, served: tuple[Agent, Conversations], raw: str
) -> None:
    alice, conversations = served
    assert alice.https_url is not None
    part = {"raw": raw, "mediaType": "text/plain", "filename": "a.txt"}
    async with httpx.AsyncClient(verify=client_context(pki, "bob"), timeout=10.0) as http:
        answer = await http.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendMessage", _params(part)),
            headers=V1_HEADERS,
        )
        rest = await http.post(
            alice.https_url + REST_PATH + "/message:send", json=_params(part), headers=V1_HEADERS
        )
    error = answer.json()["error"]
    assert (error["code"], error["message"]) == (-32600, f"INVALID_REQUEST: {NOT_BASE64}")
    assert rest.status_code == 400
    assert rest.json()["error"]["details"][0]["reason"] == "INVALID_REQUEST"
    assert raw not in answer.text and raw not in rest.text
    rows = (await records(alice))[-2:]
    assert [(r.decision, r.reason) for r in rows] == [("refuse", "INVALID_REQUEST")] * 2
    assert conversations.seen == []


async def test_url_safe_and_unpadded_bytes_still_reach_the_capability(
    pki: Pki, served: tuple[Agent, Conversations]
) -> None:
    alice, conversations = served
    assert alice.https_url is not None
    part = {"raw": "b25lIHR3bw", "mediaType": "text/plain", "filename": "a.txt"}  # "one two"
    async with httpx.AsyncClient(verify=client_context(pki, "bob"), timeout=10.0) as http:
        answer = await http.post(
            alice.https_url + JSONRPC_PATH,
            json=jsonrpc("SendMessage", _params(part)),
            headers=V1_HEADERS,
        )
    task = answer.json()["result"]["task"]
    assert task["artifacts"][0]["parts"][0]["text"] == "a.txt: 2 words"
    assert len(conversations.seen) == 1
