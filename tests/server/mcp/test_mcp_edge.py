"""The MCP edge, request by request: both protocol eras, the door's checks, cancellation.

Hand-made requests (what an SDK's client would never send) with exact
answers: HTTP status, JSON-RPC code, reason, audit record, and that nothing ran.
Every answer of ``tools/list`` and ``tools/call`` is also checked by the SDK's
own validator of its revision.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp_types import methods

from gateway.runtime.agent import Agent
from gateway.runtime.upkeep import flush_all_refusals
from gateway.server.mcp import edge
from tests.helpers.agents import Pki, WriteCounter, audit_rows
from tests.helpers.mcp import (
    ACCEPT_BOTH,
    LEGACY,
    MODERN,
    legacy_request,
    modern_call,
    raw_client,
    sse_messages,
)
from tests.helpers.task_capabilities import TaskGate


async def _records(agent: Agent) -> list[tuple[str, str, str, str]]:
    await agent.audit.flush()
    return [
        (r.peer_id.rsplit("/", 1)[-1], r.capability, r.decision, r.reason)
        for r in audit_rows(agent.config.audit_db)
    ]


async def _post(
    agent: Agent, pki: Pki, caller: str, body: Any, headers: dict[str, str]
) -> tuple[int, Any]:
    async with raw_client(pki, caller) as http:
        response = await http.post(agent.mcp_url, json=body, headers=headers)
    return response.status_code, response.json() if response.content else None


async def test_the_handshake_era_is_served_statelessly(alice: Agent, pki: Pki) -> None:
    init, headers = legacy_request(
        "initialize",
        {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    )
    async with raw_client(pki, "bob") as http:
        response = await http.post(alice.mcp_url, json=init, headers=headers)
        assert "mcp-session-id" not in response.headers  # stateless: no session to keep
        initialized = response.json()["result"]
        listing, _ = legacy_request("tools/list", request_id=2)
        tools = (await http.post(alice.mcp_url, json=listing, headers=headers)).json()["result"]
        call, _ = legacy_request(
            "tools/call", {"name": "text.echo", "arguments": {"text": "hi"}}, request_id=3
        )
        called = (await http.post(alice.mcp_url, json=call, headers=headers)).json()["result"]

    assert initialized["protocolVersion"] == LEGACY
    assert initialized["serverInfo"]["name"] == "a2a-peer-gateway"
    assert initialized["capabilities"]["tools"] is not None
    methods.validate_server_result("tools/list", LEGACY, tools)
    methods.validate_server_result("tools/call", LEGACY, called)
    assert "resultType" not in called
    assert called["structuredContent"] == {"text": "hi"}
    assert await _records(alice) == [("bob", "text.echo", "allow", "OK")]


async def test_the_2026_era_answers_carry_its_result_fields(alice: Agent, pki: Pki) -> None:
    body, headers = modern_call("text.echo", {"text": "hi"})
    status, answer = await _post(alice, pki, "bob", body, headers)
    listing = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/list",
        "params": {"_meta": body["params"]["_meta"]},
    }
    list_headers = {**headers, "Mcp-Method": "tools/list"}
    del list_headers["Mcp-Name"]
    _, tools = await _post(alice, pki, "bob", listing, list_headers)

    assert status == 200
    methods.validate_server_result("tools/call", MODERN, answer["result"])
    methods.validate_server_result("tools/list", MODERN, tools["result"])
    assert (tools["result"]["ttlMs"], tools["result"]["cacheScope"]) == (0, "private")


async def test_progress_is_streamed_when_asked_for(alice: Agent, pki: Pki, gate: TaskGate) -> None:
    gate.next_step.set()
    gate.release.set()
    body, headers = legacy_request(
        "tools/call",
        {"name": "job.steps", "arguments": {"tag": "t"}, "_meta": {"progressToken": "p1"}},
    )
    async with raw_client(pki, "bob") as http:
        response = await http.post(alice.mcp_url, json=body, headers=headers)
    assert response.headers["content-type"] == "text/event-stream"
    messages = sse_messages(response.text)
    assert [m.get("method") for m in messages] == [
        "notifications/progress",
        "notifications/progress",
        None,
    ]
    assert [m["params"] for m in messages[:2]] == [
        {"progressToken": "p1", "progress": 1, "message": "step 1"},
        {"progressToken": "p1", "progress": 2, "message": "step 2"},
    ]
    assert messages[2]["result"]["structuredContent"] == {"done": "t"}
    # Without a token (or a client that takes no stream) the answer is one JSON body.
    plain, _ = legacy_request("tools/call", {"name": "job.steps", "arguments": {"tag": "u"}})
    status, answer = await _post(alice, pki, "bob", plain, headers)
    assert (status, answer["result"]["structuredContent"]) == (200, {"done": "u"})


# An object or a list the SDK's own validation refuses before the call is built.
@pytest.mark.parametrize("token", [True, False, None], ids=["true", "false", "null"])
async def test_a_progress_token_that_is_no_string_or_number(
    alice: Agent, pki: Pki, gate: TaskGate, token: Any
) -> None:
    gate.next_step.set()
    gate.release.set()
    body, headers = legacy_request(
        "tools/call",
        {"name": "job.steps", "arguments": {"tag": "t"}, "_meta": {"progressToken": token}},
    )
    status, answer = await _post(alice, pki, "bob", body, headers)
    if token is None:  # absent, as the field is optional: a plain answer
        assert (status, answer["result"]["structuredContent"]) == (200, {"done": "t"})
        assert await _records(alice) == [("bob", "job.steps", "allow", "OK")]
        return
    assert (status, answer["error"]) == (
        200,
        {
            "code": -32602,
            "message": "INVALID_REQUEST: _meta progressToken must be a string or a number",
            "data": {"reason": "INVALID_REQUEST", "domain": "a2agw.v1"},
        },
    )
    assert await _records(alice) == [("bob", "job.steps", "refuse", "INVALID_REQUEST")]


async def test_a_cancellation_notification_cancels_the_callers_own_call(
    alice: Agent, pki: Pki, gate: TaskGate
) -> None:
    body, headers = legacy_request(
        "tools/call", {"name": "job.linger", "arguments": {"tag": "t"}}, request_id=7
    )
    cancel, _ = legacy_request(
        "notifications/cancelled", {"requestId": 7, "reason": "no longer needed"}, request_id=None
    )
    async with raw_client(pki, "bob") as http:
        call = asyncio.create_task(http.post(alice.mcp_url, json=body, headers=headers))
        await asyncio.wait_for(gate.started.wait(), 10)
        # Another caller naming the same id cancels nothing.
        assert await _post(alice, pki, "carol", cancel, headers) == (202, None)
        await asyncio.sleep(0.2)
        assert not gate.cancelled.is_set()
        assert await _post(alice, pki, "bob", cancel, headers) == (202, None)
        await asyncio.wait_for(gate.cancelled.wait(), 10)
        gate.next_step.set()
        answer = (await asyncio.wait_for(call, 10)).json()

    assert answer["id"] == 7
    assert answer["error"]["data"]["reason"] == "CANCELLED"
    await alice.audit.flush()
    [record] = [r for r in audit_rows(alice.config.audit_db) if r.capability == "job.linger"]
    assert (record.decision, record.reason, record.detail) == (
        "allow",
        "CANCELLED",
        "cancelled by the MCP client (notifications/cancelled)",
    )


async def test_a_body_over_the_callers_limit_is_refused_unread(
    alice: Agent, pki: Pki, counter: WriteCounter
) -> None:
    # bob's cap is 1024 bytes: the body may hold twice that plus a 64 KiB envelope.
    body, headers = modern_call("notes.write", {"note": "x" * 70_000})
    status, answer = await _post(alice, pki, "bob", body, headers)
    assert status == 413
    assert (answer["id"], answer["error"]["data"]["reason"]) == (None, "PAYLOAD_TOO_LARGE")
    assert counter.calls == 0
    assert await _records(alice) == [("bob", "", "refuse", "PAYLOAD_TOO_LARGE")]


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    alice: Agent, pki: Pki, counter: WriteCounter
) -> None:
    # No Content-Length to refuse it by: counted as it arrives.
    body, headers = legacy_request("tools/call", {"name": "notes.write", "arguments": {}})
    body["params"]["arguments"] = {"note": "x" * 70_000}
    data = json.dumps(body).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), 4096):
            yield data[start : start + 4096]

    async with raw_client(pki, "bob") as http:
        response = await http.post(
            alice.mcp_url, content=chunks(), headers={**headers, "Content-Type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["data"]["reason"] == "PAYLOAD_TOO_LARGE"
    assert counter.calls == 0
    assert await _records(alice) == [("bob", "", "refuse", "PAYLOAD_TOO_LARGE")]


async def test_a_body_that_trickles_is_refused_at_its_deadline(
    alice: Agent, pki: Pki, counter: WriteCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(edge, "BODY_SECONDS", 0.5)
    body, headers = legacy_request(
        "tools/call", {"name": "notes.write", "arguments": {"note": "n"}}
    )
    data = json.dumps(body).encode()

    async def trickle() -> AsyncIterator[bytes]:
        yield data[:10]
        await asyncio.sleep(1.0)  # twice the deadline
        yield data[10:]

    async with raw_client(pki, "bob") as http:
        response = await http.post(
            alice.mcp_url,
            content=trickle(),
            headers={**headers, "Content-Type": "application/json"},
        )
    assert response.status_code == 504
    assert response.json()["error"]["data"]["reason"] == "DEADLINE_EXCEEDED"
    assert counter.calls == 0
    assert await _records(alice) == [("bob", "", "refuse", "DEADLINE_EXCEEDED")]


async def test_a_caller_over_its_rate_is_refused_before_its_body_is_read(
    alice: Agent, pki: Pki
) -> None:
    body, headers = modern_call("text.echo", {"text": "hi"})
    first, _ = await _post(alice, pki, "erin", body, headers)
    second, answer = await _post(alice, pki, "erin", body, headers)
    assert (first, second) == (200, 429)
    assert answer["error"]["data"]["reason"] == "RATE_LIMITED"
    flush_all_refusals(alice.handler.limit_refusals)
    records = await _records(alice)
    assert ("erin", "text.echo", "allow", "OK") in records
    assert [r for r in records if r[3] == "RATE_LIMITED"] == [
        ("erin", "", "refuse", "RATE_LIMITED")
    ]


async def test_a_call_over_max_in_flight_is_a_tool_error_but_a_listing_is_not_held(
    alice: Agent, pki: Pki, gate: TaskGate
) -> None:
    lingering, headers = modern_call("job.linger", {"tag": "t"})
    echo, echo_headers = modern_call("text.echo", {"text": "hi"}, request_id=2)
    listing = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/list",
        "params": {"_meta": lingering["params"]["_meta"]},
    }
    list_headers = {k: v for k, v in headers.items() if k != "Mcp-Name"}
    async with raw_client(pki, "frank") as http:
        first = asyncio.create_task(http.post(alice.mcp_url, json=lingering, headers=headers))
        await asyncio.wait_for(gate.started.wait(), 10)
        status, second = await _post(alice, pki, "frank", echo, echo_headers)
        listed_status, listed = await _post(
            alice, pki, "frank", listing, {**list_headers, "Mcp-Method": "tools/list"}
        )
        gate.release.set()
        done = (await asyncio.wait_for(first, 10)).json()["result"]
    assert (status, second["result"]["_meta"]["a2agw/reason"]) == (200, "CONCURRENCY_LIMITED")
    assert listed_status == 200 and len(listed["result"]["tools"]) == 2
    assert done["structuredContent"] == {"done": "t"}


@pytest.mark.parametrize(
    ("header", "value", "status", "reason"),
    [
        ("Authorization", "Bearer someone-else", 401, "UNAUTHENTICATED"),
        ("X-Forwarded-Client-Cert", "By=spiffe://example.org/agent/alice", 401, "UNAUTHENTICATED"),
        ("Origin", "https://evil.example", 403, "INVALID_REQUEST"),
        ("Host", "rebound.example:443", 403, "INVALID_REQUEST"),
    ],
)
async def test_requests_claiming_an_identity_or_from_a_page_are_refused(
    alice: Agent, pki: Pki, header: str, value: str, status: int, reason: str
) -> None:
    body, headers = modern_call("text.echo", {"text": "hi"})
    answered, answer = await _post(alice, pki, "bob", body, {**headers, header: value})
    assert (answered, answer["error"]["data"]["reason"]) == (status, reason)
    assert await _records(alice) == [("bob", "", "refuse", reason)]


async def test_no_stream_no_session_no_other_path(alice: Agent, pki: Pki) -> None:
    async with raw_client(pki, "bob") as http:
        get = await http.get(alice.mcp_url, headers={"Accept": "text/event-stream"})
        delete = await http.delete(alice.mcp_url)
        elsewhere = await http.post(alice.mcp_url.replace("/mcp", "/other"), json={})
    assert (get.status_code, get.headers["allow"]) == (405, "POST")
    assert delete.status_code == 405
    assert elsewhere.status_code == 404
    assert elsewhere.json()["error"]["data"]["reason"] == "INVALID_REQUEST"
    assert await _records(alice) == [("bob", "", "refuse", "INVALID_REQUEST")]


async def test_a_request_id_in_meta_is_the_replay_id(alice: Agent, pki: Pki) -> None:
    answers = []
    for _ in range(2):
        body, headers = modern_call("text.echo", {"text": "hi"}, meta={"a2agw/request_id": "req-1"})
        answers.append((await _post(alice, pki, "bob", body, headers))[1]["result"])
    assert answers[0]["isError"] is False
    assert (answers[1]["isError"], answers[1]["_meta"]["a2agw/reason"]) == (
        True,
        "REPLAYED_REQUEST",
    )
    await alice.audit.flush()
    records = audit_rows(alice.config.audit_db)
    assert [(r.request_id, r.decision, r.reason) for r in records] == [
        ("req-1", "allow", "OK"),
        ("req-1", "refuse", "REPLAYED_REQUEST"),
    ]


async def test_an_idempotency_key_runs_a_write_once(
    alice: Agent, pki: Pki, counter: WriteCounter
) -> None:
    results = []
    for _ in range(2):
        body, headers = modern_call(
            "notes.write", {"note": "n"}, meta={"a2agw/idempotency_key": "key-1"}
        )
        results.append((await _post(alice, pki, "bob", body, headers))[1]["result"])
    assert counter.calls == 1
    assert [r["_meta"]["a2agw/replayed"] for r in results] == [False, True]
    assert results[0]["structuredContent"] == results[1]["structuredContent"] == {"stored": 1}


@pytest.mark.parametrize(
    ("meta", "code", "reason"),
    [
        ({"a2agw/peer": "spiffe://example.org/agent/alice"}, -32010, "UNAUTHENTICATED"),
        ({"a2agw/colour": "red"}, -32602, "INVALID_REQUEST"),
        ({"a2agw/request_id": 5}, -32602, "INVALID_REQUEST"),
        ({"a2agw/request_id": "has space"}, -32602, "INVALID_REQUEST"),
    ],
)
async def test_meta_that_claims_or_confuses_is_refused(
    alice: Agent, pki: Pki, meta: dict[str, Any], code: int, reason: str
) -> None:
    body, headers = modern_call("text.echo", {"text": "hi"}, meta=meta)
    status, answer = await _post(alice, pki, "bob", body, headers)
    assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (code, reason)
    assert status == (400 if code == -32602 else 200)
    assert await _records(alice) == [("bob", "text.echo", "refuse", reason)]


async def test_the_sdks_protocol_checks_answer_as_the_sdk_does_and_are_audited(
    alice: Agent, pki: Pki
) -> None:
    call, legacy = legacy_request("tools/call", {"name": "text.echo", "arguments": {"text": "x"}})
    bad_params, _ = legacy_request("tools/call", {"name": "text.echo", "arguments": [1, 2]})
    modern, headers = modern_call("text.echo", {"text": "hi"})
    cases = [
        (call, {**legacy, "Accept": "text/plain"}, 406),
        (call, {**legacy, "Content-Type": "text/plain"}, 415),
        (bad_params, legacy, 200),  # the handshake era answers JSON-RPC errors with 200
        (modern, {**headers, "Mcp-Name": "text.search"}, 400),  # header mismatch
        (modern, {**headers, "Content-Type": "text/plain"}, 400),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, legacy, 200),
    ]
    answered = []
    async with raw_client(pki, "bob") as http:
        for body, with_headers, _ in cases:
            response = await http.post(alice.mcp_url, json=body, headers=with_headers)
            code = response.json()["error"]["code"] if response.content else None
            answered.append((response.status_code, code))
        not_json = await http.post(
            alice.mcp_url,
            content=b"{not json",
            headers={**legacy, "Content-Type": "application/json"},
        )
    assert answered == [
        (406, None),
        (415, None),
        (200, -32602),
        (400, -32020),
        (400, None),
        (200, -32602),
    ]
    assert (not_json.status_code, not_json.json()["error"]["code"]) == (400, -32700)
    assert await _records(alice) == [("bob", "", "refuse", "INVALID_REQUEST")] * 7


async def test_tools_list_has_one_page(alice: Agent, pki: Pki) -> None:
    body, headers = legacy_request("tools/list", {"cursor": "next"})
    status, answer = await _post(alice, pki, "bob", body, headers)
    assert (status, answer["error"]["code"]) == (200, -32602)
    assert await _records(alice) == [("bob", "", "refuse", "INVALID_REQUEST")]


async def test_ping_and_unknown_methods_are_the_sdks(alice: Agent, pki: Pki) -> None:
    ping, headers = legacy_request("ping")
    unknown, _ = legacy_request("resources/list")
    assert await _post(alice, pki, "bob", ping, headers) == (
        200,
        {"jsonrpc": "2.0", "id": 1, "result": {}},
    )
    status, answer = await _post(alice, pki, "bob", unknown, {**headers, "Accept": ACCEPT_BOTH})
    assert answer["error"]["code"] == -32601
    del status


@pytest.mark.parametrize(
    "request_id",
    [b"null", b"true", b"1.5", b'{"a":1}', b"123456789012345678901234567890"],
    ids=["null", "boolean", "fraction", "object", "beyond-64-bits"],
)
async def test_a_call_whose_id_is_no_request_id_is_refused_and_runs_nothing(
    alice: Agent, pki: Pki, counter: WriteCounter, request_id: bytes
) -> None:
    # The SDK reads such a message as a notification; the edge must not run it as a call.
    params = b'{"name":"notes.write","arguments":{"note":"n"}}'
    body = b'{"jsonrpc":"2.0","id":' + request_id + b',"method":"tools/call","params":' + params
    _, headers = legacy_request("tools/call")
    async with raw_client(pki, "bob") as http:
        response = await http.post(
            alice.mcp_url,
            content=body + b"}",
            headers={**headers, "Content-Type": "application/json"},
        )
    answer = response.json()
    assert (response.status_code, answer["id"], answer["error"]["code"]) == (400, None, -32600)
    assert counter.calls == 0
    assert await _records(alice) == [("bob", "", "refuse", "INVALID_REQUEST")]
