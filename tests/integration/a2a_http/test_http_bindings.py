"""The A2A HTTP bindings over real HTTPS: one decision path, one audit record, the spec's errors.

Every request here crosses a real TLS handshake to ``alice`` (uvicorn, the
a2a-sdk's routes, our handler, the gRPC servicer). Refusals are checked for
their exact wire form on each binding, their audit record, and that nothing ran.
Streaming, subscriptions and cancel over HTTP are in test_http_streaming.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.audit import AuditRecord
from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.server.a2a_http.edge import ENVELOPE_BYTES
from tests.a2a_http_support import (
    JSON_HEADERS,
    V1_HEADERS,
    client_context,
    https_client,
    jsonrpc,
    message_params,
    our_reason,
)
from tests.support import Pki, WriteCounter, audit_rows


async def records(agent: Agent) -> list[AuditRecord]:
    await agent.audit.flush()
    return audit_rows(agent.config.audit_db)


async def new_records(agent: Agent, before: int) -> list[AuditRecord]:
    return (await records(agent))[before:]


async def post_jsonrpc(
    client: httpx.AsyncClient, agent: Agent, body: Any, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    response = await client.post(
        agent.https_url + JSONRPC_PATH,
        json=body,
        headers=V1_HEADERS if headers is None else headers,
    )
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    return answer


async def post_rest(
    client: httpx.AsyncClient, agent: Agent, path: str, body: Any
) -> httpx.Response:
    return await client.post(agent.https_url + REST_PATH + path, json=body, headers=V1_HEADERS)


def assert_jsonrpc_refusal(answer: dict[str, Any], reason: str, code: int) -> None:
    error = answer["error"]
    assert (error["code"], our_reason(error["data"])) == (code, reason)
    assert error["message"].startswith(f"{reason}: ")


def assert_rest_refusal(response: httpx.Response, reason: str, status: int) -> None:
    error = response.json()["error"]
    assert (response.status_code, error["code"], our_reason(error["details"])) == (
        status,
        status,
        reason,
    )
    assert error["message"].startswith(f"{reason}: ")


async def test_sendmessage_on_both_bindings_is_one_call_with_one_record(
    pki: Pki, alice: Agent
) -> None:
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        answer = await post_jsonrpc(
            client, alice, jsonrpc("SendMessage", message_params("text.echo", {"text": "hi"}))
        )
        rest = await post_rest(
            client, alice, "/message:send", message_params("text.echo", {"text": "yo"})
        )
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["data"] == {"text": "hi"}
    assert rest.status_code == 200
    assert rest.json()["task"]["artifacts"][0]["parts"][0]["data"] == {"text": "yo"}
    added = await new_records(alice, before)
    assert [(r.peer_id, r.capability, r.decision, r.reason) for r in added] == [
        ("spiffe://example.org/agent/bob", "text.echo", "allow", "OK")
    ] * 2


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_no_certificate_is_unauthenticated_and_audited(
    pki: Pki, alice: Agent, binding: str
) -> None:
    before = len(await records(alice))
    params = message_params("text.echo", {"text": "hi"})
    async with https_client(pki, None) as client:
        if binding == "jsonrpc":
            answer = await post_jsonrpc(client, alice, jsonrpc("SendMessage", params))
            assert_jsonrpc_refusal(answer, "UNAUTHENTICATED", -32000)
        else:
            response = await post_rest(client, alice, "/message:send", params)
            assert_rest_refusal(response, "UNAUTHENTICATED", 401)
    [record] = await new_records(alice, before)
    assert (record.peer_id, record.decision, record.reason) == ("", "refuse", "UNAUTHENTICATED")


@pytest.mark.parametrize("header", ["X-Forwarded-Client-Cert", "Authorization", "X-SPIFFE-ID"])
async def test_an_identity_in_headers_is_refused(
    pki: Pki, alice: Agent, counter: WriteCounter, header: str
) -> None:
    before = len(await records(alice))
    params = message_params("notes.write", {"note": "x"})
    async with https_client(pki, "carol") as client:
        answer = await post_jsonrpc(
            client,
            alice,
            jsonrpc("SendMessage", params),
            headers={**V1_HEADERS, header: "spiffe://example.org/agent/bob"},
        )
    assert_jsonrpc_refusal(answer, "UNAUTHENTICATED", -32000)
    [record] = await new_records(alice, before)
    assert (record.peer_id, record.reason) == (
        "spiffe://example.org/agent/carol",
        "UNAUTHENTICATED",
    )
    assert counter.calls == 0


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_body_over_the_cap_is_refused_before_it_is_decoded(
    pki: Pki, alice: Agent, binding: str
) -> None:
    # Not JSON at all: had any decoder seen it, the answer would be a parse error.
    limit = 2 * 1024 + ENVELOPE_BYTES
    garbage = b"\xff{" * (limit // 2 + 1)
    before = len(await records(alice))
    path = JSONRPC_PATH if binding == "jsonrpc" else REST_PATH + "/message:send"
    async with https_client(pki, "bob") as client:
        response = await client.post(alice.https_url + path, content=garbage, headers=JSON_HEADERS)
    if binding == "jsonrpc":
        assert_jsonrpc_refusal(response.json(), "PAYLOAD_TOO_LARGE", -32000)
    else:
        assert_rest_refusal(response, "PAYLOAD_TOO_LARGE", 429)
    [record] = await new_records(alice, before)
    assert (record.peer_id, record.reason) == (
        "spiffe://example.org/agent/bob",
        "PAYLOAD_TOO_LARGE",
    )


async def test_a_chunked_body_over_the_cap_is_cut_off_unread(pki: Pki, alice: Agent) -> None:
    async def chunks() -> Any:
        for _ in range(80):
            yield b"\x00" * 1024  # no Content-Length: counted as it arrives

    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        response = await client.post(
            alice.https_url + JSONRPC_PATH, content=chunks(), headers=JSON_HEADERS
        )
    assert_jsonrpc_refusal(response.json(), "PAYLOAD_TOO_LARGE", -32000)
    [record] = await new_records(alice, before)
    assert record.reason == "PAYLOAD_TOO_LARGE"


@pytest.mark.parametrize(
    ("caller", "capability", "data", "reason", "code", "status"),
    [
        ("carol", "kv.get", {"key": "a"}, "CAPABILITY_NOT_GRANTED", -32000, 403),
        ("carol", "notes.write", {"note": "x"}, "RISK_NOT_GRANTED", -32000, 403),
        ("bob", "notes.write", {"note": "x" * 2000}, "PAYLOAD_TOO_LARGE", -32000, 429),
        ("bob", "notes.write", {"wrong": 1}, "INVALID_INPUT", -32602, 400),
        ("dave", "text.echo", {"text": "hi"}, "GRANT_EXPIRED", -32000, 403),
        ("mallory", "text.echo", {"text": "hi"}, "UNKNOWN_PEER", -32000, 403),
    ],
)
@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_refusals_carry_our_reason_on_each_binding(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    binding: str,
    caller: str,
    capability: str,
    data: dict[str, Any],
    reason: str,
    code: int,
    status: int,
) -> None:
    before = len(await records(alice))
    params = message_params(capability, data)
    async with https_client(pki, caller) as client:
        if binding == "jsonrpc":
            answer = await post_jsonrpc(client, alice, jsonrpc("SendMessage", params, 7))
            assert_jsonrpc_refusal(answer, reason, code)
            # Refused before the body is parsed (the caller's grant is checked
            # first), the request's id is not known yet: null, as JSON-RPC says.
            before_parsing = reason in {"GRANT_EXPIRED", "UNKNOWN_PEER"}
            assert answer["id"] == (None if before_parsing else 7)
        else:
            assert_rest_refusal(
                await post_rest(client, alice, "/message:send", params), reason, status
            )
    [record] = await new_records(alice, before)
    assert (record.decision, record.reason) == ("refuse", reason)
    assert counter.calls == 0


async def test_what_the_sdk_refuses_is_audited_as_invalid_request(pki: Pki, alice: Agent) -> None:
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        not_json = await client.post(
            alice.https_url + JSONRPC_PATH, content=b"{nope", headers=JSON_HEADERS
        )
        unknown = await post_jsonrpc(client, alice, jsonrpc("NoSuchMethod", {}))
        bad_rest = await client.post(
            alice.https_url + REST_PATH + "/message:send", content=b"[1]", headers=JSON_HEADERS
        )
        no_route = await client.get(alice.https_url + "/nowhere")
    assert_jsonrpc_refusal(not_json.json(), "INVALID_REQUEST", -32700)
    assert_jsonrpc_refusal(unknown, "INVALID_REQUEST", -32601)
    assert_rest_refusal(bad_rest, "INVALID_REQUEST", 400)
    assert_rest_refusal(no_route, "INVALID_REQUEST", 404)
    added = await new_records(alice, before)
    assert [(r.peer_id, r.reason) for r in added] == [
        ("spiffe://example.org/agent/bob", "INVALID_REQUEST")
    ] * 4


async def test_a_missing_version_header_is_refused_after_identity(pki: Pki, alice: Agent) -> None:
    before = len(await records(alice))
    params = message_params("text.echo", {"text": "hi"})
    async with https_client(pki, "bob") as client:
        answer = await post_jsonrpc(client, alice, jsonrpc("SendMessage", params), headers={})
    assert_jsonrpc_refusal(answer, "VERSION_NOT_SUPPORTED", -32009)
    [record] = await new_records(alice, before)
    assert (record.peer_id, record.reason) == (
        "spiffe://example.org/agent/bob",
        "VERSION_NOT_SUPPORTED",
    )


async def test_the_version_may_be_a_request_parameter_instead_of_a_header(
    pki: Pki, alice: Agent
) -> None:
    # A2A 1.0 section 3.6.1: "Clients MAY provide the A2A-Version as a request parameter
    # instead of a header" (GET /tasks/task-123?A2A-Version=1.0). The header, when sent, wins.
    params = message_params("text.echo", {"text": "by parameter"})
    async with https_client(pki, "bob") as client:
        sent = await client.post(
            alice.https_url + JSONRPC_PATH + "?A2A-Version=1.0", json=jsonrpc("SendMessage", params)
        )
        task_id = sent.json()["result"]["task"]["id"]
        got = await client.get(f"{alice.https_url}{REST_PATH}/tasks/{task_id}?a2a-version=1.0")
        before = len(await records(alice))
        overridden = await client.get(
            f"{alice.https_url}{REST_PATH}/tasks/{task_id}?A2A-Version=1.0",
            headers={"A2A-Version": "0.2"},
        )
    assert sent.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert (got.status_code, got.json()["id"]) == (200, task_id)
    assert_rest_refusal(overridden, "VERSION_NOT_SUPPORTED", 400)
    [record] = await new_records(alice, before)
    assert record.reason == "VERSION_NOT_SUPPORTED"


async def test_another_peers_task_is_not_found_on_both_bindings(pki: Pki, alice: Agent) -> None:
    async with https_client(pki, "bob") as bob:
        answer = await post_jsonrpc(
            bob, alice, jsonrpc("SendMessage", message_params("text.echo", {"text": "mine"}))
        )
        task_id = answer["result"]["task"]["id"]
        own = await bob.get(f"{alice.https_url}{REST_PATH}/tasks/{task_id}", headers=V1_HEADERS)
    assert own.status_code == 200 and own.json()["id"] == task_id
    before = len(await records(alice))
    async with https_client(pki, "carol") as carol:
        rpc = await post_jsonrpc(carol, alice, jsonrpc("GetTask", {"id": task_id}))
        rest = await carol.get(f"{alice.https_url}{REST_PATH}/tasks/{task_id}", headers=V1_HEADERS)
    assert_jsonrpc_refusal(rpc, "TASK_NOT_FOUND", -32001)
    assert_rest_refusal(rest, "TASK_NOT_FOUND", 404)
    spec = rest.json()["error"]["details"][0]
    assert (spec["domain"], spec["reason"]) == ("a2a-protocol.org", "TASK_NOT_FOUND")
    added = await new_records(alice, before)
    assert [(r.peer_id, r.reason) for r in added] == [
        ("spiffe://example.org/agent/carol", "TASK_NOT_FOUND")
    ] * 2


async def test_a_tenant_in_the_rest_path_is_refused_like_one_in_the_body(
    pki: Pki, alice: Agent
) -> None:
    before = len(await records(alice))
    async with https_client(pki, "bob") as client:
        response = await client.get(
            f"{alice.https_url}/acme{REST_PATH}/tasks/some-task", headers=V1_HEADERS
        )
    assert_rest_refusal(response, "INVALID_REQUEST", 400)
    assert "tenants are not supported" in response.json()["error"]["message"]
    [record] = await new_records(alice, before)
    assert (record.peer_id, record.reason) == ("spiffe://example.org/agent/bob", "INVALID_REQUEST")


async def test_a_certificate_of_another_ca_fails_the_handshake(pki: Pki, alice: Agent) -> None:
    context = client_context(pki, None)
    context.load_cert_chain(pki.foreign_dir / "bob.pem", pki.foreign_dir / "bob.key")
    before = len(await records(alice))
    async with httpx.AsyncClient(verify=context) as client:
        with pytest.raises(httpx.HTTPError):
            await client.post(alice.https_url + JSONRPC_PATH, json={}, headers=V1_HEADERS)
    assert len(await records(alice)) == before  # no request was ever made, as on gRPC


@pytest.mark.parametrize(
    "uris",
    [[], ["spiffe://example.org/agent/bob", "spiffe://example.org/agent/carol"]],
    ids=["no-spiffe-id", "two-spiffe-ids"],
)
async def test_a_verified_certificate_without_exactly_one_spiffe_id_is_unauthenticated(
    pki: Pki, alice: Agent, tmp_path: Path, uris: list[str]
) -> None:
    odd = pki.odd_material(uris=uris)
    (tmp_path / "odd.pem").write_bytes(odd.cert_pem)
    (tmp_path / "odd.key").write_bytes(odd.key_pem)
    context = client_context(pki, None)
    context.load_cert_chain(tmp_path / "odd.pem", tmp_path / "odd.key")
    before = len(await records(alice))
    params = message_params("text.echo", {"text": "hi"})
    async with httpx.AsyncClient(verify=context) as client:
        response = await post_rest(client, alice, "/message:send", params)
    assert_rest_refusal(response, "UNAUTHENTICATED", 401)
    [record] = await new_records(alice, before)
    assert (record.peer_id, record.reason) == ("", "UNAUTHENTICATED")
