"""Media types on the HTTP bindings: a body is taken only when declared JSON; answers say theirs.

A browser sends a cross-site POST without asking first (no CORS preflight) only
as a form (``application/x-www-form-urlencoded``, ``multipart/form-data``),
``text/plain``, or with no ``Content-Type``, and it presents the client
certificate it holds: such a post would run a write as that certificate's
agent. Each is refused ``CONTENT_TYPE_NOT_SUPPORTED`` (JSON-RPC ``-32005``,
HTTP ``415``), audited once under the caller, before the body is read: nothing runs.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import V1_HEADERS, https_client, jsonrpc, message_params, our_reason
from tests.support import Pki, WriteCounter, audit_rows, spiffe

BOB = spiffe("bob")
NOT_JSON = [
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    None,
]
"""What a browser sends cross-site without a preflight (None: no Content-Type)."""


def write_request(binding: str) -> tuple[str, bytes]:
    """(path, JSON body) of a SendMessage that would write (``notes.write``)."""
    params = message_params("notes.write", {"note": "x"})
    if binding == "jsonrpc":
        return JSONRPC_PATH, json.dumps(jsonrpc("SendMessage", params)).encode()
    return REST_PATH + "/message:send", json.dumps(params).encode()


async def post(
    pki: Pki, agent: Agent, path: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    async with https_client(pki, "bob") as client:
        return await client.post(agent.https_url + path, content=body, headers=headers)


async def reasons(agent: Agent, before: int) -> list[tuple[str, str, str]]:
    await agent.audit.flush()
    return [(r.peer_id, r.decision, r.reason) for r in audit_rows(agent.config.audit_db)[before:]]


@pytest.mark.parametrize("content_type", NOT_JSON)
@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_json_body_not_declared_json_runs_nothing(
    pki: Pki, alice: Agent, counter: WriteCounter, binding: str, content_type: str | None
) -> None:
    path, body = write_request(binding)
    headers = {**V1_HEADERS, **({"Content-Type": content_type} if content_type else {})}
    before = len(audit_rows(alice.config.audit_db))
    answer = await post(pki, alice, path, body, headers)
    if binding == "jsonrpc":
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert (error["code"], our_reason(error["data"])) == (-32005, "CONTENT_TYPE_NOT_SUPPORTED")
        assert error["data"][0]["domain"] == "a2a-protocol.org"
    else:
        assert (answer.status_code, answer.headers["content-type"]) == (415, "application/json")
        error = answer.json()["error"]
        assert (error["code"], our_reason(error["details"])) == (415, "CONTENT_TYPE_NOT_SUPPORTED")
    assert error["message"].startswith("CONTENT_TYPE_NOT_SUPPORTED: the request body must be JSON")
    assert await reasons(alice, before) == [(BOB, "refuse", "CONTENT_TYPE_NOT_SUPPORTED")]
    assert counter.calls == 0


async def test_a_0_3_client_is_told_in_its_own_error_form(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    # No A2A-Version: the 0.3 JSON-RPC error form (data an object), whose codes include -32005.
    path, body = write_request("jsonrpc")
    answer = await post(pki, alice, path, body, {"Content-Type": "text/plain"})
    error = answer.json()["error"]
    assert (error["code"], error["data"]["reason"]) == (-32005, "CONTENT_TYPE_NOT_SUPPORTED")
    assert counter.calls == 0


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/a2a+json",
        "Application/JSON",
    ],
)
@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a_body_declared_json_is_served(
    pki: Pki, alice: Agent, counter: WriteCounter, binding: str, content_type: str
) -> None:
    path, body = write_request(binding)
    answer = await post(pki, alice, path, body, {**V1_HEADERS, "Content-Type": content_type})
    result: dict[str, Any] = answer.json()
    task = result["result"]["task"] if binding == "jsonrpc" else result["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert answer.headers["content-type"] == "application/json"  # spec 1.0.0 9.1 and 11.1
    assert counter.calls == 1


async def test_a_bodyless_cancel_is_a_write_and_needs_the_media_type_too(
    pki: Pki, alice: Agent
) -> None:
    # A form with no fields posts an empty body, and a no-cors fetch one with no Content-Type.
    before = len(audit_rows(alice.config.audit_db))
    for headers in ({"Content-Type": "text/plain"}, {}):
        answer = await post(
            pki, alice, REST_PATH + "/tasks/t-1:cancel", b"", {**V1_HEADERS, **headers}
        )
        assert answer.status_code == 415
    assert await reasons(alice, before) == [(BOB, "refuse", "CONTENT_TYPE_NOT_SUPPORTED")] * 2
