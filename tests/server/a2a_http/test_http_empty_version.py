"""An empty ``A2A-Version`` header on the A2A HTTP bindings is A2A 0.3.

A2A 1.0 section 3.6.2: "Agents MUST interpret empty value as 0.3 version"
(and 3.6.1: "0.3 will be assumed for empty header"). With ``[a2a]
v0_3_compat`` (the default) a 0.3 request sent with ``A2A-Version:`` (empty)
was refused ``VERSION_NOT_SUPPORTED`` ("A2A version '' is not supported"),
while the same request without the header was served: the empty value was
taken for a version of its own. It is now served as 0.3, exactly as without
the header; a 1.0 method sent with an empty version is still refused, as 0.3.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.helpers.a2a_http import https_client, jsonrpc, our_reason
from tests.helpers.agents import (
    AgentFactory,
    Pki,
    audit_rows,
    grant,
    spiffe,
)

BOB = spiffe("bob")
EMPTY = {"A2A-Version": ""}


@pytest.fixture
async def alice(make_agent: AgentFactory) -> Agent:
    return await make_agent(grants=[grant("bob", ["text.echo@^1"])], https=True)


async def reasons(agent: Agent) -> list[tuple[str, str, str]]:
    await agent.audit.flush()
    return [(r.peer_id, r.reason, r.detail) for r in audit_rows(agent.config.audit_db)]


def v0_3_send(text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": "r1",
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": f"m-{text}",
                "role": "user",
                "parts": [{"kind": "data", "data": {"text": text}}],
                "metadata": {"a2agw.capability": "text.echo"},
            }
        },
    }


async def test_a_v0_3_jsonrpc_request_with_an_empty_version_is_served_as_v0_3(
    pki: Pki, alice: Agent
) -> None:
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH, json=v0_3_send("empty"), headers=EMPTY
        )
    body = answer.json()
    assert "error" not in body, body
    assert body["result"]["status"]["state"] == "completed"  # the 0.3 task form
    assert (await reasons(alice))[-1][:2] == (BOB, "OK")


@pytest.mark.parametrize(
    ("path", "request_body"),
    [
        (JSONRPC_PATH, {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": "t1"}}),
        (REST_PATH + "/v1/tasks/t1", None),
    ],
)
async def test_an_empty_version_answers_as_no_version_does(
    pki: Pki, alice: Agent, path: str, request_body: dict[str, Any] | None
) -> None:
    async with https_client(pki, "bob") as client:

        async def call(headers: dict[str, str]) -> tuple[int, Any]:
            if request_body is None:
                answer = await client.get(alice.https_url + path, headers=headers)
            else:
                answer = await client.post(
                    alice.https_url + path, json=request_body, headers=headers
                )
            return answer.status_code, answer.json()

        without = await call({})
        empty = await call(EMPTY)
    assert "TASK_NOT_FOUND" in str(without)  # the 0.3 answer for an unknown task
    assert empty == without


async def test_a_v1_method_with_an_empty_version_is_still_refused(pki: Pki, alice: Agent) -> None:
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH, json=jsonrpc("ListTasks", {}), headers=EMPTY
        )
    error = answer.json()["error"]
    assert (error["code"], our_reason(error["data"])) == (-32009, "VERSION_NOT_SUPPORTED")
    assert (await reasons(alice))[-1] == (BOB, "VERSION_NOT_SUPPORTED", "A2A ListTasks")
