"""A2A 0.3 on the HTTP bindings (``[a2a] v0_3_compat``, on by default): the same door.

A 0.3 request (JSON-RPC ``message/send`` ... on the same path, REST under
``/a2a/rest/v1/...``) passes the edge's checks before its body is parsed,
then the a2a-sdk translates it and the same servicer decides and audits it.
These requests are written by hand in the 0.3 wire form; the a2a-go client
and Java SDK clients run in tests/interop/test_a2a_0_3_clients.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.audit.record import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import https_client, serving_https
from tests.support import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

BOB = spiffe("bob")
CAROL = spiffe("carol")
REST_V0_3 = REST_PATH + "/v1"
POISON = b"\xff{" * (40 * 1024)
"""80 KiB that no parser takes: past bob's body limit (2 x 1024 + 64 KiB), and not JSON."""


def v0_3_message(capability: str, data: dict[str, Any]) -> dict[str, Any]:
    """A 0.3 JSON-RPC ``message/send`` params object (parts with ``kind``)."""
    return {
        "message": {
            "kind": "message",
            "messageId": str(uuid.uuid4()),
            "role": "user",
            "parts": [{"kind": "data", "data": data}],
            "metadata": {"a2agw.capability": capability},
        }
    }


def v0_3_rest_message(capability: str, data: dict[str, Any]) -> dict[str, Any]:
    """A 0.3 REST ``/v1/message:send`` body (the 0.3 proto JSON: ``content``, ``ROLE_USER``)."""
    return {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "content": [{"data": {"data": data}}],
            "metadata": {"a2agw.capability": capability},
        }
    }


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}


async def new_records(agent: Agent, before: int) -> list[tuple[str, str, str]]:
    await agent.audit.flush()
    rows: list[AuditRecord] = audit_rows(agent.config.audit_db)[before:]
    return [(r.peer_id, r.capability, r.reason) for r in rows]


async def count(agent: Agent) -> int:
    await agent.audit.flush()
    return len(audit_rows(agent.config.audit_db))


def assert_v0_3_refusal(answer: dict[str, Any], reason: str, code: int) -> None:
    """The 0.3 JSON-RPC error form: ``data`` an object naming our reason."""
    error = answer["error"]
    assert (error["code"], error["data"]["reason"]) == (code, reason), error
    assert error["message"].startswith(f"{reason}: ")
    assert error["data"]["error"] == error["message"]  # a2a-go appends data.error to its error


async def test_a_0_3_json_rpc_call_is_served_and_audited_once(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    before = await count(alice)
    async with https_client(pki, "bob") as client:
        sent = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("message/send", v0_3_message("notes.write", {"note": "n"})),
        )
        task = sent.json()["result"]
        got = await client.post(
            alice.https_url + JSONRPC_PATH, json=rpc("tasks/get", {"id": task["id"]})
        )
    assert (task["kind"], task["status"]["state"]) == ("task", "completed")
    assert task["artifacts"][0]["parts"][0] == {"kind": "data", "data": {"stored": 1}}
    assert (got.json()["result"]["id"], got.json()["result"]["status"]["state"]) == (
        task["id"],
        "completed",
    )
    assert counter.calls == 1
    assert await new_records(alice, before) == [  # a write: admitted, then its outcome
        (BOB, "notes.write", "ADMITTED"),
        (BOB, "notes.write", "OK"),
    ]


@pytest.mark.parametrize(
    ("caller", "capability", "data", "reason", "code"),
    [
        ("carol", "notes.write", {"note": "x"}, "RISK_NOT_GRANTED", -32000),
        ("carol", "kv.get", {"key": "a"}, "CAPABILITY_NOT_GRANTED", -32000),
        ("bob", "notes.write", {"note": "x" * 2000}, "PAYLOAD_TOO_LARGE", -32000),
        ("bob", "notes.write", {"wrong": 1}, "INVALID_INPUT", -32602),
    ],
)
async def test_a_0_3_refusal_carries_its_reason_and_has_no_side_effect(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    caller: str,
    capability: str,
    data: dict[str, Any],
    reason: str,
    code: int,
) -> None:
    before = await count(alice)
    async with https_client(pki, caller) as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH, json=rpc("message/send", v0_3_message(capability, data))
        )
    assert answer.status_code == 200
    assert_v0_3_refusal(answer.json(), reason, code)
    assert answer.json()["id"] == "r1"
    assert counter.calls == 0
    assert await new_records(alice, before) == [(spiffe(caller), capability, reason)]


async def test_another_peers_task_is_not_found_in_0_3_too(pki: Pki, alice: Agent) -> None:
    async with https_client(pki, "bob") as bob:
        sent = await bob.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("message/send", v0_3_message("text.echo", {"text": "mine"})),
        )
    task_id = sent.json()["result"]["id"]
    before = await count(alice)
    async with https_client(pki, "carol") as carol:
        rpc_answer = await carol.post(
            alice.https_url + JSONRPC_PATH, json=rpc("tasks/get", {"id": task_id})
        )
        rest_answer = await carol.get(f"{alice.https_url}{REST_V0_3}/tasks/{task_id}")
        cancel = await carol.post(
            alice.https_url + JSONRPC_PATH, json=rpc("tasks/cancel", {"id": task_id})
        )
        resubscribe = await carol.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("tasks/resubscribe", {"id": task_id}),
            headers={"Accept": "text/event-stream"},
        )
    assert_v0_3_refusal(rpc_answer.json(), "TASK_NOT_FOUND", -32001)
    assert rest_answer.status_code == 404
    assert rest_answer.json()["error"]["message"].startswith("TASK_NOT_FOUND: ")
    assert rest_answer.headers["content-type"] == "application/json"  # 0.3's, and 1.0.0's
    assert_v0_3_refusal(cancel.json(), "TASK_NOT_FOUND", -32001)
    [event] = [line[5:] for line in resubscribe.text.splitlines() if line.startswith("data:")]
    assert_v0_3_refusal(httpx.Response(200, content=event.strip()).json(), "TASK_NOT_FOUND", -32001)
    assert await new_records(alice, before) == [(CAROL, "", "TASK_NOT_FOUND")] * 4


async def test_a_0_3_rest_send_is_served_and_its_task_is_the_callers(
    pki: Pki, alice: Agent
) -> None:
    before = await count(alice)
    async with https_client(pki, "bob") as client:
        sent = await client.post(
            f"{alice.https_url}{REST_V0_3}/message:send",
            json=v0_3_rest_message("text.echo", {"text": "hi"}),
        )
        assert sent.status_code == 200, sent.text
        task = sent.json()["task"]
        got = await client.get(f"{alice.https_url}{REST_V0_3}/tasks/{task['id']}")
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["data"]["data"] == {"text": "hi"}
    assert got.status_code == 200 and got.json()["id"] == task["id"]
    assert await new_records(alice, before) == [(BOB, "text.echo", "OK")]  # reads: no record


@pytest.mark.parametrize(
    "path", [JSONRPC_PATH, f"{REST_V0_3}/message:send", f"{REST_V0_3}/message:stream"]
)
async def test_a_0_3_body_over_the_cap_is_refused_before_it_is_parsed(
    pki: Pki, alice: Agent, path: str
) -> None:
    # A 0.3 start, then bytes no parser takes, sent chunked (no Content-Length):
    # the edge must count it and refuse it before the SDK's 0.3 adapter reads it
    # (which would answer a parse error, INVALID_REQUEST, instead).
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": "r1", "method": "message/send", "params": '
        for start in range(0, len(POISON), 4096):
            yield POISON[start : start + 4096]

    before = await count(alice)
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + path, content=chunks(), headers={"Content-Type": "application/json"}
        )
    if path == JSONRPC_PATH:
        assert_v0_3_refusal(answer.json(), "PAYLOAD_TOO_LARGE", -32000)
    else:
        assert answer.status_code == 429
        assert answer.json()["error"]["message"].startswith("PAYLOAD_TOO_LARGE: ")
    assert await new_records(alice, before) == [(BOB, "", "PAYLOAD_TOO_LARGE")]


async def test_without_a_certificate_a_0_3_call_is_unauthenticated_audited(
    pki: Pki, alice: Agent
) -> None:
    before = await count(alice)
    async with https_client(pki, None) as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("message/send", v0_3_message("text.echo", {"text": "hi"})),
        )
    assert_v0_3_refusal(answer.json(), "UNAUTHENTICATED", -32000)
    assert await new_records(alice, before) == [("", "", "UNAUTHENTICATED")]


async def test_the_servicer_not_the_sdk_refuses_a_version_0_3_clients_do_not_send(
    pki: Pki, alice: Agent
) -> None:
    before = await count(alice)
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("message/send", v0_3_message("text.echo", {"text": "hi"})),
            headers={"A2A-Version": "0.2"},
        )
    # -32009 is 1.0's; a 0.3 client gets -32000 and the reason in data.
    assert_v0_3_refusal(answer.json(), "VERSION_NOT_SUPPORTED", -32000)
    assert await new_records(alice, before) == [(BOB, "", "VERSION_NOT_SUPPORTED")]


async def test_a_refused_0_3_stream_is_one_error_event_and_one_record(
    pki: Pki, alice: Agent
) -> None:
    before = await count(alice)
    async with https_client(pki, "carol") as client:
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("message/stream", v0_3_message("kv.get", {"key": "a"})),
            headers={"Accept": "text/event-stream"},
        )
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [line[5:].strip() for line in answer.text.splitlines() if line.startswith("data:")]
    assert len(events) == 1
    assert_v0_3_refusal(
        httpx.Response(200, content=events[0]).json(), "CAPABILITY_NOT_GRANTED", -32000
    )
    assert await new_records(alice, before) == [(CAROL, "kv.get", "CAPABILITY_NOT_GRANTED")]


@pytest.fixture
async def alice_1_0_only(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    policy = write_policy(tmp_path / "alice-policy.toml", [grant("bob", ["text.echo"])])
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    config = config.model_copy(update={"a2a": config.a2a.model_copy(update={"v0_3_compat": False})})
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


async def test_with_v0_3_compat_off_0_3_requests_are_refused_audited(
    pki: Pki, alice_1_0_only: Agent
) -> None:
    alice = alice_1_0_only
    before = await count(alice)
    async with https_client(pki, "bob") as client:
        card = (await client.get(alice.https_url + "/.well-known/agent-card.json")).json()
        answer = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=rpc("message/send", v0_3_message("text.echo", {"text": "hi"})),
        )
        rest = await client.post(
            f"{alice.https_url}{REST_V0_3}/message:send",
            json=v0_3_rest_message("text.echo", {"text": "hi"}),
        )
    assert {i["protocolVersion"] for i in card["supportedInterfaces"]} == {"1.0"}
    assert "url" not in card and "preferredTransport" not in card
    # A request naming no version gets the 1.0 form: no 0.3 field anywhere, skills present.
    assert "type" not in card["securitySchemes"]["mtls"] and card["skills"] == []
    assert len(card["signatures"]) == 1
    error = answer.json()["error"]
    assert (error["code"], error["message"].split(":")[0]) == (-32601, "INVALID_REQUEST")
    assert rest.status_code == 404
    assert rest.json()["error"]["message"].startswith("INVALID_REQUEST: ")
    assert await new_records(alice, before) == [(BOB, "", "INVALID_REQUEST")] * 2


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_0_3_stream_ends_terminal_and_gives_its_limit_slot_back(
    pki: Pki, alice: Agent, binding: str
) -> None:
    # The SDK's 0.3 adapters start a stream only once the response is sent; the
    # edge starts it first, so the pipeline has adopted the slot by then.
    before = await count(alice)
    async with https_client(pki, "bob") as client:
        if binding == "jsonrpc":
            answer = await client.post(
                alice.https_url + JSONRPC_PATH,
                json=rpc("message/stream", v0_3_message("text.echo", {"text": "s"})),
                headers={"Accept": "text/event-stream"},
            )
        else:
            answer = await client.post(
                f"{alice.https_url}{REST_V0_3}/message:stream",
                json=v0_3_rest_message("text.echo", {"text": "s"}),
                headers={"Accept": "text/event-stream"},
            )
    assert answer.status_code == 200
    events = [
        httpx.Response(200, content=line[5:].strip()).json()
        for line in answer.text.splitlines()
        if line.startswith("data:")
    ]
    if binding == "jsonrpc":
        kinds = [e["result"]["kind"] for e in events]
        assert kinds == ["task", "status-update", "artifact-update", "status-update"]
        assert events[-1]["result"]["final"] is True
        assert events[-1]["result"]["status"]["state"] == "completed"
    else:
        assert [next(iter(e)) for e in events] == [
            "task",
            "statusUpdate",
            "artifactUpdate",
            "statusUpdate",
        ]
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert alice.limit_stats().in_flight_total == 0
    assert await new_records(alice, before) == [(BOB, "text.echo", "OK")]
