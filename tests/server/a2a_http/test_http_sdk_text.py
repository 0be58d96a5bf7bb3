"""What the a2a-sdk quotes of a request reaches neither our log nor the answer.

Found by sending requests the SDK cannot parse with a value only the body held:
the SDK logged it at ERROR and WARNING (protobuf's ``ParseError`` text,
pydantic's ``input_value=...``, the tracebacks), and over REST its parse
message carried it back in the error. The gateway had audited each of them
without the value all along; now the SDK's log lines keep only their facts
(``gateway.telemetry.sdk_logs``) and only the SDK's fixed texts reach a caller.
A later round found every stream the gateway refused logged at ERROR (the SDK
takes the refusal for its own internal error): such lines are now DEBUG, and
the SDK's lines are never above WARNING (the gateway logs its own errors).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.telemetry.sdk_logs import RELAY_LOGGER
from tests.helpers.a2a_http import V1_HEADERS, https_client, jsonrpc, message_params, our_reason
from tests.helpers.agents import Pki, WriteCounter, audit_rows, spiffe

SECRET = "s3cr3t-payload-7f1c"
BOB = spiffe("bob")


def message(**fields: Any) -> dict[str, Any]:
    return {"messageId": "m-1", "role": "ROLE_USER", "parts": [], **fields}


CASES = {
    "jsonrpc metadata not an object": (
        JSONRPC_PATH,
        jsonrpc("SendMessage", {"message": message(metadata=SECRET)}),
        V1_HEADERS,
    ),
    "jsonrpc historyLength not a number": (
        JSONRPC_PATH,
        jsonrpc("GetTask", {"id": "t-1", "historyLength": SECRET}),
        V1_HEADERS,
    ),
    "rest metadata not an object": (
        REST_PATH + "/message:send",
        {"message": message(metadata=SECRET)},
        V1_HEADERS,
    ),
    "0.3 jsonrpc role and data part invalid": (
        JSONRPC_PATH,
        jsonrpc(
            "message/send",
            {"message": {**message(role=SECRET), "parts": [{"kind": "data", "data": SECRET}]}},
        ),
        {},
    ),
    "0.3 jsonrpc historyLength not a number": (
        JSONRPC_PATH,
        jsonrpc("tasks/get", {"id": "t-1", "historyLength": SECRET}),
        {},
    ),
}


class OperatorLog(logging.Handler):
    """What a handler on the root logger writes (as ``a2a-gateway serve``'s does), traceback too.

    Not ``caplog``: pytest also attaches its handler to every logger that does not
    propagate, so it sees the SDK's own records, which no handler of ours does.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.names.append(record.name)


@pytest.fixture
def operator_log() -> Iterator[OperatorLog]:
    root = logging.getLogger()
    handler, level = OperatorLog(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_request_the_sdk_cannot_parse_is_refused_without_its_text(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    operator_log: OperatorLog,
    case: str,
) -> None:
    path, body, headers = CASES[case]
    await alice.audit.flush()
    db = alice.config.audit_db
    assert isinstance(db, Path)
    before = len(audit_rows(db))
    async with https_client(pki, "bob") as client:
        response = await client.post(alice.https_url + path, json=body, headers=headers)
    await alice.audit.flush()
    assert SECRET not in response.text
    error = response.json()["error"]
    if path == JSONRPC_PATH and not headers:  # 0.3: its error form
        assert (response.status_code, error["data"]["reason"]) == (200, "INVALID_REQUEST")
    elif path == JSONRPC_PATH:
        assert (response.status_code, our_reason(error["data"])) == (200, "INVALID_REQUEST")
    else:
        assert (response.status_code, our_reason(error["details"])) == (400, "INVALID_REQUEST")
    assert error["message"].startswith("INVALID_REQUEST: ")
    server_lines = [
        line
        for name, line in zip(operator_log.names, operator_log.lines, strict=True)
        if not name.startswith(("httpx", "httpcore"))  # the test's own client
    ]
    assert not [line for line in server_lines if SECRET in line]
    relayed = [line for line in server_lines if line.startswith(RELAY_LOGGER + " ")]
    assert relayed, "the SDK logged nothing: the case no longer reaches its parser"
    assert all(" a2a-sdk a2a." in line and "text withheld" in line for line in relayed)
    assert not [name for name in operator_log.names if name.startswith("a2a.")]
    added = audit_rows(db)[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (BOB, "refuse", "INVALID_REQUEST")
    ]
    assert not any(SECRET in str(field) for field in astuple(added[0]))
    assert counter.calls == 0


def relayed_levels(operator_log: OperatorLog) -> list[str]:
    """The level of each relayed SDK line."""
    return [
        line.split(" ", 2)[1]
        for name, line in zip(operator_log.names, operator_log.lines, strict=True)
        if name == RELAY_LOGGER
    ]


REFUSED_STREAMS = {
    "a stream of a capability not granted": (
        jsonrpc("SendStreamingMessage", message_params("admin.wipe", {})),
        "CAPABILITY_NOT_GRANTED",
    ),
    "a subscription to a task that is not there": (
        jsonrpc("SubscribeToTask", {"id": "no-such-task"}),
        "TASK_NOT_FOUND",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_STREAMS))
async def test_the_sdks_lines_about_a_refused_stream_are_debug_not_error(
    pki: Pki, alice: Agent, counter: WriteCounter, operator_log: OperatorLog, case: str
) -> None:
    # Found by an attack round: the SDK logs a stream the gateway refused as its
    # own internal error, so every refused stream wrote an ERROR line (a refused
    # SendMessage writes none).
    body, reason = REFUSED_STREAMS[case]
    before = len(audit_rows(alice.config.audit_db))
    async with https_client(pki, "bob") as client:
        response = await client.post(
            alice.https_url + JSONRPC_PATH,
            json=body,
            headers={**V1_HEADERS, "Accept": "text/event-stream"},
        )
    assert our_reason(response.json()["error"]["data"]) == reason
    levels = relayed_levels(operator_log)
    assert levels and set(levels) == {"DEBUG"}
    await alice.audit.flush()
    added = audit_rows(alice.config.audit_db)[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [(BOB, "refuse", reason)]
    assert counter.calls == 0


async def test_the_sdks_lines_about_a_request_it_cannot_read_are_warnings_at_most(
    pki: Pki, alice: Agent, operator_log: OperatorLog
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": None}
    async with https_client(pki, "bob") as client:
        response = await client.post(alice.https_url + JSONRPC_PATH, json=body, headers=V1_HEADERS)
    assert our_reason(response.json()["error"]["data"]) == "INVALID_REQUEST"
    levels = relayed_levels(operator_log)
    assert levels and set(levels) <= {"DEBUG", "INFO", "WARNING"}


async def test_the_sdks_notice_that_the_public_card_has_no_skills_is_debug(
    pki: Pki, alice: Agent, operator_log: OperatorLog
) -> None:
    # Found by a newcomer walkthrough: building the public card (no skills, by
    # design) logged a WARNING saying the text was withheld because "it may quote
    # the request", with no request behind it.
    alice.public_card.invalidate()  # built anew by this request
    async with https_client(pki, None) as client:
        card = await client.get(alice.https_url + "/.well-known/agent-card.json")
    assert card.status_code == 200 and not card.json().get("skills")
    levels = relayed_levels(operator_log)
    assert levels and set(levels) == {"DEBUG"}
