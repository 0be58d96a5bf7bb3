"""A JSON body holding a lone UTF-16 surrogate (``"\\ud800"``) on the A2A HTTP bindings.

``json`` reads such an escape as a str with no UTF-8 form. Before the fix,
every answer that echoed it could not be encoded: a JSON-RPC request whose
``id`` was ``"\\ud800"`` answered ``500 Internal Server Error`` (text/plain,
not a JSON-RPC response) whatever its method, with an "Exception in ASGI
application" traceback at ERROR and, for a refusal the SDK made (unknown
method ...), no audit record; a ``SendMessage`` ran its capability and lost
its answer. On HTTP+JSON an SDK parse error that quotes the value
(``"metadata": "<text>\\ud800"`` -> "Struct must be in a dict which is
<text>...") failed the same way, and its traceback put the request's text
in the log. The edge now refuses such a body ``INVALID_REQUEST`` (audited)
before the SDK parses it (A2A 1.0 sections 9.5 / 11.6: an error in the
binding's form; RFC 8259 8.1-8.2: JSON text is Unicode, UTF-8).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from tests.a2a_http_support import (
    JSON_HEADERS,
    V1_HEADERS,
    https_client,
    our_reason,
    serving_https,
)
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
SECRET = "s3cr3t-surrogate-9b2e"
"""Text only the request body holds: never in the log or the audit."""
LONE = "\\ud800"
"""A lone surrogate as JSON writes it (the six characters backslash-u-d-8-0-0)."""


@pytest.fixture
async def alice(pki: Pki, tmp_path: Path, counter: WriteCounter) -> AsyncIterator[Agent]:
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", ["text.echo@^1", "notes.write@1"], max_payload_bytes=4096)],
    )
    config = serving_https(agent_config(pki, tmp_path, "alice", policy), pki, tmp_path / "https")
    agent = await started(config, standard_registry(counter, tmp_path / "alice-state"))
    yield agent
    await agent.stop()


async def records(agent: Agent) -> list[tuple[str, str, str, str]]:
    await agent.audit.flush()
    return [(r.peer_id, r.decision, r.reason, r.detail) for r in audit_rows(agent.config.audit_db)]


def rpc_body(method: str, params_json: str) -> bytes:
    return (
        '{"jsonrpc": "2.0", "id": "r-' + LONE + '", "method": "' + method + '", '
        '"params": ' + params_json + "}"
    ).encode()


NOTE = (
    '{"message": {"messageId": "MID", "role": "ROLE_USER", '
    '"parts": [{"data": {"text": "' + SECRET + '"}}], '
    '"metadata": {"a2agw.capability": "notes.write"}}}'
)


@pytest.mark.parametrize(
    ("method", "params", "operation"),
    [
        ("ListTasks", "{}", "A2A JSON-RPC"),
        ("Nope", "{}", "A2A JSON-RPC"),  # the SDK's own refusal: was unaudited
        ("tasks/get", '{"id": "t1"}', "A2A JSON-RPC"),  # A2A 0.3 on the same route
    ],
)
async def test_a_jsonrpc_id_with_a_lone_surrogate_is_an_audited_invalid_request(
    pki: Pki,
    alice: Agent,
    method: str,
    params: str,
    operation: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = len(await records(alice))
    with caplog.at_level(logging.WARNING):
        async with https_client(pki, "bob") as client:
            answer = await client.post(
                alice.https_url + JSONRPC_PATH,
                content=rpc_body(method, params),
                headers={**V1_HEADERS, "content-type": "application/json"},
            )
    assert answer.status_code == 200
    body = answer.json()
    assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", None, -32600)
    error = body["error"]
    data = error["data"] if isinstance(error["data"], list) else error["data"]["details"]
    assert our_reason(data) == "INVALID_REQUEST"
    assert error["message"].startswith("INVALID_REQUEST: ")
    added = (await records(alice))[before:]
    assert added == [(BOB, "refuse", "INVALID_REQUEST", operation)]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_send_message_with_such_an_id_runs_nothing(
    pki: Pki, alice: Agent, counter: WriteCounter, caplog: pytest.LogCaptureFixture
) -> None:
    before = len(await records(alice))
    params = NOTE.replace("MID", str(uuid.uuid4()))
    with caplog.at_level(logging.WARNING):
        async with https_client(pki, "bob") as client:
            answer = await client.post(
                alice.https_url + JSONRPC_PATH,
                content=rpc_body("SendMessage", params),
                headers=JSON_HEADERS,
            )
    assert (answer.status_code, answer.json()["error"]["code"]) == (200, -32600)
    assert counter.calls == 0  # the write never ran (it used to run, then answer 500)
    added = (await records(alice))[before:]
    assert added == [(BOB, "refuse", "INVALID_REQUEST", "A2A JSON-RPC")]
    assert SECRET not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize(
    ("path", "operation", "headers"),
    [
        ("/message:send", "A2A SendMessage", JSON_HEADERS),
        ("/v1/message:send", "A2A SendMessage", {"content-type": "application/json"}),  # 0.3
    ],
)
async def test_a_rest_body_whose_quoted_value_holds_a_lone_surrogate_is_refused(
    pki: Pki,
    alice: Agent,
    path: str,
    operation: str,
    headers: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = len(await records(alice))
    body = (
        '{"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [], '
        '"metadata": "' + SECRET + LONE + '"}}'
    ).encode()
    with caplog.at_level(logging.WARNING):
        async with https_client(pki, "bob") as client:
            answer = await client.post(
                alice.https_url + REST_PATH + path, content=body, headers=headers
            )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], our_reason(error["details"])) == (400, "INVALID_REQUEST")
    assert SECRET not in answer.text
    added = (await records(alice))[before:]
    assert added == [(BOB, "refuse", "INVALID_REQUEST", operation)]
    assert SECRET not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_an_escaped_surrogate_pair_is_still_served(pki: Pki, alice: Agent) -> None:
    body = (
        '{"message": {"messageId": "' + str(uuid.uuid4()) + '", "role": "ROLE_USER", '
        '"parts": [{"data": {"text": "smile \\ud83d\\ude00"}}], '
        '"metadata": {"a2agw.capability": "text.echo"}}}'
    ).encode()
    async with https_client(pki, "bob") as client:
        answer = await client.post(
            alice.https_url + REST_PATH + "/message:send", content=body, headers=JSON_HEADERS
        )
    assert answer.status_code == 200, answer.text
    task = answer.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["data"] == {"text": "smile \U0001f600"}
